"""The pre-flight GPU smoke test: before any rank starts, prove every GPU node can compute on its GPUs.

Run on every node of a gpu/mpi-gpu job, in the runtime the job uses (inside the run's image with
``--gpus all`` or the AMD devices, or the node's own Python), a few seconds each:

1. torch sees a GPU (else: "no NVIDIA driver visible in the container", or the ROCm equivalent);
2. the job asks for no more processes per node than the node has GPUs (NCCL refuses two ranks on
   one GPU mid-start with "Duplicate GPU detected");
3. torch was built with kernels for the device's architecture (sm_75 for a T4, gfx1011 for a V520)
   and one matmul on every requested GPU agrees with the same product on the CPU;
4. a reduction on the GPU gives the exact integer sum.

The check itself is :data:`SMOKE_SCRIPT`, which prints one ``GPUCHECK {json}`` line; everything
else here is pure: :func:`smoke_commands` plans what runs where, :func:`failure_line` turns a
node's answer into the one line the user sees (unit-tested on recorded answers), and
:func:`gpu_smoke` is the thin executor.
"""

from __future__ import annotations

import json
import re

from multinode.core.errors import PreflightFailed
from multinode.core.inventory import Inventory
from multinode.core.config import LaunchSpec
from multinode.plan.launchers.base import NodeCommand, nproc_of
from multinode.plan.runtime import runtime_for

SMOKE_TIMEOUT = 120  # seconds: a cold container start plus importing torch and initialising CUDA

# Prints exactly one line, "GPUCHECK {json}". Kept to the stdlib and torch: it runs in the user's image.
SMOKE_SCRIPT = r"""
import json, os, re, sys
def report(**kw):
    print("GPUCHECK " + json.dumps(kw), flush=True)
    sys.exit(0)
try:
    import torch
except Exception as err:
    report(error="no_torch", detail=f"{type(err).__name__}: {err}")
want = int(sys.argv[1])
hip = getattr(torch.version, "hip", None)
info = dict(torch=torch.__version__, cuda=torch.version.cuda, hip=hip,
            archs=torch.cuda.get_arch_list() if torch.cuda.is_available() else [],
            devices=[p for p in os.listdir("/dev") if p.startswith(("nvidia", "kfd", "dri"))])
if not torch.cuda.is_available():
    report(error="no_gpu", **info)
count = torch.cuda.device_count()
props = torch.cuda.get_device_properties(0)
arch = props.gcnArchName.split(":")[0] if hip else f"sm_{props.major}{props.minor}"
info.update(gpus=count, name=props.name, arch=arch)
# What was found, before anything can take the process down (rocBLAS aborts without a kernel library).
print("GPUCHECK-DEVICE " + json.dumps(info), flush=True)
if want > count:
    report(error="too_many_procs", want=want, **info)
for index in range(want):
    dev = torch.device("cuda", index)
    try:
        a = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) % 7
        got = (a.to(dev) @ a.to(dev)).cpu()
        total = torch.ones(1 << 20, device=dev).sum().item()
        torch.cuda.synchronize(dev)
    except Exception as err:
        text = str(err)
        kind = "no_kernels" if re.search(r"no kernel image|invalid device function|NoBinaryForGpu|no binary for gpu", text, re.I) else "gpu_error"
        report(error=kind, device=index, detail=text.strip().splitlines()[0][:300], **info)
    if not torch.equal(got, a @ a):
        report(error="wrong_matmul", device=index, detail=f"max error {(got - a @ a).abs().max().item()}", **info)
    if total != float(1 << 20):
        report(error="wrong_reduction", device=index, detail=f"sum of 2^20 ones gave {total}", **info)
report(ok=True, **info)
"""

RESULT = re.compile(r"^GPUCHECK (\{.*\})\s*$")
DEVICE = re.compile(r"^GPUCHECK-DEVICE (\{.*\})\s*$")
# rocBLAS without a Tensile library for the GPU prints this and aborts the process (SIGABRT; no Python
# exception): "rocBLAS error: Cannot read <library>/TensileLibrary.dat: <No such file or directory | Illegal seek>
# for GPU arch : gfx1201", then " List of available TensileLibrary Files :" and one quoted
# "...TensileLibrary_lazy_<arch>.dat" per line; the rocBLAS of ROCm 5.4 stops after the reason, naming no arch.
# Real outputs, with their sources: tests/unit/fixtures/gpu_refusals (the abort: ROCm/rocBLAS issue 1339).
ROCBLAS_NO_ARCH = re.compile(
    r"rocBLAS error: Cannot read \S*TensileLibrary\.dat: [^\n]*?(?: for GPU arch : (gfx\w+))?$", re.M)
ROCBLAS_HAS = re.compile(r"TensileLibrary_lazy_(gfx\w+)\.dat")
# What the container CLI says when the node cannot give a container the GPU (docker's own line; it may be followed
# by "ERRO[0000] error waiting for container: ...": the line quoted is the one that matched).
NO_TOOLKIT = re.compile(
    r".*(could not select device driver|nvidia-container-cli|unknown or invalid runtime name: nvidia).*", re.I)
NO_DEVICE = re.compile(r".*(error gathering device information while adding custom device \"?/dev/(kfd|dri)"
                       r"|no such file or directory.*?/dev/(kfd|dri)).*", re.I)


def smoke_commands(inventory: Inventory, spec: LaunchSpec) -> dict[str, NodeCommand]:
    """Per GPU node, the command that runs the smoke test for the node's process count (the runtime wraps
    it like the job)."""
    commands = {}
    for node in inventory.nodes:
        if node.accelerator == "none":
            continue
        commands[node.name] = NodeCommand(
            node=node.name,
            argv=("timeout", str(SMOKE_TIMEOUT - 5), inventory.interpreter, "-c", SMOKE_SCRIPT, str(nproc_of(spec, node))),
            cwd="/tmp",  # runs before the code is synced: nothing of ours is needed
        )
    return commands


def failure_line(node: str, image: str | None, exit_code: int | None, stdout: str, stderr: str) -> str | None:
    """The one line naming ``node`` and the cause, or None when its GPUs passed."""
    where = f"torch in {image}" if image else "the node's torch"
    answer, device = _last_json(RESULT, stdout), _last_json(DEVICE, stdout) or {}
    if answer is None:
        return _no_answer_line(node, where, device, exit_code, stdout, stderr)
    if answer.get("ok"):
        return None
    error = answer.get("error")
    archs = ", ".join(answer.get("archs") or []) or "none"
    if error == "no_torch":
        return f"{node}: {where} cannot be imported ({answer.get('detail')})"
    if error == "no_gpu":
        kind = "ROCm" if answer.get("hip") else "CUDA" if answer.get("cuda") else "CPU-only"
        if kind == "CPU-only":
            return f"{node}: {where} is a CPU-only build ({answer.get('torch')}); use an image with a CUDA or ROCm build of torch"
        if kind == "CUDA":
            return (f"{node}: no NVIDIA driver visible in the container (torch {answer.get('torch')} with CUDA "
                    f"{answer.get('cuda')} sees no GPU; devices: {', '.join(answer.get('devices') or []) or 'none'})")
        return (f"{node}: no AMD GPU visible (torch {answer.get('torch')} with ROCm {answer.get('hip')} sees none; "
                f"devices: {', '.join(answer.get('devices') or []) or 'none'}); is the amdgpu driver loaded?")
    if error == "too_many_procs":
        return (f"{node}: NPROC={answer.get('want')} but the node has {answer.get('gpus')} GPU(s); "
                f"use NPROC={answer.get('gpus')} or fewer (or NPROC=auto)")
    if error == "no_kernels":
        return (f"{node}: {where} has no kernels for {answer.get('arch')} ({answer.get('name')}); "
                f"it was built for {archs}: use a build for {answer.get('arch')} (docker/README.md)")
    if error in ("wrong_matmul", "wrong_reduction"):
        what = "a matmul" if error == "wrong_matmul" else "a reduction"
        return f"{node}: {what} on GPU {answer.get('device')} ({answer.get('name')}) gave a wrong result ({answer.get('detail')})"
    return f"{node}: GPU {answer.get('device')} ({answer.get('name')}) failed the smoke test: {answer.get('detail')}"


def _last_json(pattern: re.Pattern, stdout: str) -> dict | None:
    found = None
    for line in stdout.splitlines():
        match = pattern.match(line.strip())
        if match:
            found = json.loads(match[1])
    return found


def _no_answer_line(node: str, where: str, device: dict, exit_code: int | None, stdout: str, stderr: str) -> str:
    """The line for a smoke test that gave no answer: the engine could not start it, it hung, or a library
    took the process down (``device``: what it had found by then, from its GPUCHECK-DEVICE line)."""
    text = (stderr or stdout).strip()
    last = text.splitlines()[-1] if text else f"exit code {exit_code}"
    rocblas = ROCBLAS_NO_ARCH.search(text)
    if rocblas:
        has = ", ".join(ROCBLAS_HAS.findall(text))
        arch = rocblas[1] or device.get("arch") or "its architecture"
        name = device.get("name") or "its GPU"
        return (f"{node}: {where} has no kernels for {arch} ({name}): rocBLAS aborted at the first matmul"
                f"{f' (it has kernels for {has})' if has else ''}; use a build for {arch} (docker/README.md)")
    toolkit, no_device = NO_TOOLKIT.search(text), NO_DEVICE.search(text)
    if toolkit:
        return (f"{node}: no NVIDIA driver visible in the container (the container engine cannot give it the GPU: "
                f"{toolkit[0].strip()}); install the NVIDIA container toolkit or use the Deep Learning Base OSS Nvidia "
                f"Driver AMI")
    if no_device:
        return (f"{node}: no AMD GPU devices (/dev/kfd, /dev/dri) on the node ({no_device[0].strip()}); "
                f"is the amdgpu driver loaded?")
    if exit_code == 124:
        return f"{node}: the GPU smoke test did not finish within {SMOKE_TIMEOUT - 5} s (a hung driver or device?)"
    return f"{node}: the GPU smoke test could not run ({last})"


def gpu_smoke(runner, inventory: Inventory, spec: LaunchSpec) -> None:
    """Run the smoke test on every GPU node at once; raise PreflightFailed with the first node's line."""
    commands = smoke_commands(inventory, spec)
    if not commands:
        return
    smoke_run = f"{spec.run_id}-gpucheck"  # its own container names: nothing to clash with the job's
    runtime = runtime_for(inventory, smoke_run)
    lines = {name: runtime.wrap(cmd) for name, cmd in commands.items()}
    results = runner.run_each(lines, timeout=SMOKE_TIMEOUT)
    for name in lines:
        res = results[name]
        if res.exit_code is None:
            raise PreflightFailed(f"{name} stopped answering during the GPU smoke test: {res.error}")
        line = failure_line(name, runtime.image(),
                            res.exit_code, res.stdout, res.stderr)
        if line:
            raise PreflightFailed(line)
