"""What the GPU check ran on: the GPU (name, count, compute capability, memory), the driver, torch and the CUDA,
NCCL and cuDNN it carries, the CPU, and the MPI runtime with the launcher line the check uses for it.

:func:`mpi_launcher` is pure (what ``mpirun --version`` said in, argv prefix out); :func:`describe` asks the machine.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def mpi_launcher(system_mpirun: str | None, version_text: str, carried_prefix: str | None) -> dict | None:
    """How the check starts MPI ranks: ``{"argv": prefix, "env": extra environment, "library": ..., "source": ...}``,
    or None when there is no MPI runtime. The machine's own ``mpirun`` first; else MPICH from a carried wheel
    (``pip install --prefix P mpich``: ``P/bin/mpiexec``, and ``P/lib/libmpi.so.12`` for mpi4py, which loads the
    library ``MPI4PY_LIBMPI`` names: mpi4py's ``_mpiabi.py``). Open MPI refuses root without
    ``--allow-run-as-root``, and pins every rank of one node to core 0 without ``--bind-to none`` (FIELD-NOTES)."""
    if system_mpirun:
        first = version_text.strip().splitlines()[0] if version_text.strip() else "unknown"
        if re.search(r"Open MPI|OpenRTE", version_text):
            argv = [system_mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
        else:
            argv = [system_mpirun]
        return {"argv": argv, "env": {}, "library": first, "source": "the machine's mpirun"}
    if carried_prefix:
        prefix = Path(carried_prefix)
        # MPIR_CVAR_ENABLE_GPU=0: MPICH's switch for its GPU support (a CVAR its libmpi.so.12 carries), so the data
        # plane asks an MPI that says it takes no device buffers and stages them through the host (item 3).
        env = {"MPI4PY_LIBMPI": str(prefix / "lib" / "libmpi.so.12"), "MPIR_CVAR_ENABLE_GPU": "0"}
        return {"argv": [str(prefix / "bin" / "mpiexec")], "env": env, "library": "MPICH (carried wheel)",
                "source": f"carried wheel in {prefix}"}
    return None


def _version(version) -> str:
    return ".".join(map(str, version)) if isinstance(version, (tuple, list)) else str(version)


def describe(device: str, carried_mpi: str | None) -> dict:
    """The machine, as this process sees it."""
    import torch

    cpu = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    info = {"mode": device, "python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cpu": cpu[1].strip() if cpu else platform.processor(),
            "cpu_cores": os.cpu_count(), "kernel": platform.release()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpus=torch.cuda.device_count(), capability=f"{props.major}.{props.minor}",
                    gpu_memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                    nccl=_version(torch.cuda.nccl.version()), cudnn=torch.backends.cudnn.version(),
                    arch_list=torch.cuda.get_arch_list(), bf16_supported=torch.cuda.is_bf16_supported())
        smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"])
        fields = [f.strip() for f in smi.splitlines()[0].split(",")] if smi.strip() else []
        if len(fields) == 4:
            info.update(smi_name=fields[0], driver=fields[1], smi_compute_cap=fields[2], smi_memory=fields[3])
        # The node bootstrap's own count (infra/ec2/user_data.sh.tftpl: nvidia-smi -L | grep -c '^GPU ').
        info["smi_gpus"] = sum(1 for line in _run(["nvidia-smi", "-L"]).splitlines() if line.startswith("GPU "))
    system = shutil.which("mpirun")
    info["mpi"] = mpi_launcher(system, _run([system, "--version"]) if system else "", carried_mpi)
    if info["mpi"] and not system:  # the carried MPICH names its own version
        said = _run([str(Path(carried_mpi) / "bin" / "mpichversion")]).strip().splitlines()
        info["mpi"]["library"] = " ".join(said[0].split()) if said else info["mpi"]["library"]
    try:
        import mpi4py

        info["mpi4py"] = mpi4py.__version__
    except ImportError:
        info["mpi4py"] = None
    return info
