"""Entry point: one data-parallel trainer for torchrun, mpirun, srun or a plain process.

    torchrun --nnodes=2 --nproc-per-node=1 ... training/train.py --workload digits 10 5
    mpirun -np 2 ... python training/train.py --workload digits 10 5      (MPI gradient data plane)
    python training/train.py --workload regression 5 5                  (one process)
    python training/train.py --spawn 2 --workload digits 10 5           (2 ranks, torch.multiprocessing.spawn)

Positional ``total_epochs save_every`` and ``--batch-size`` (per rank) as in the seed scripts;
``--help`` lists the rest (--workload, --config, --snapshot-dir, --metrics-dir, --timeout, --device,
--backend, --data-plane, --lr, --seed, --grad-accum, --amp, --deterministic, --patience, --stop-after-epoch,
--log-samples ...).
The global batch is ``--batch-size x --grad-accum x world size`` on a fresh start; a resume keeps its
snapshot's, on any world size (rank 0 logs ``global batch G = W ranks x S samples (A micro-batches of up to
M)`` and prints ``RESUMED {json}``, see ``training/checkpoint.py``).

Rank 0 ends with ``RESULT {json}`` (what the orchestrator's summary reads: workload, launcher,
world_size, backend, data_plane, amp, test_accuracy | loss_reduction | collective_ok, ...; a job of several ranks
adds ``weights_sha256``, rank 0's final weights, and ``ranks_weights_equal``: whether every rank holds the same).
Exit codes: 0 done; 1 failed (or hello's collective was wrong); 2 bad input, one line on stderr,
before any process group exists; 3 stopped on purpose by --stop-after-epoch; 75 preempted: a spot notice
(or SIGTERM with MULTINODE_GRACE) stopped every rank at the same step after one snapshot (rank 0 prints
``PREEMPTED {json}``, see ``training/preempt.py``). Under mpirun an uncaught exception on any rank aborts
every rank.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import random
import socket
import sys
from pathlib import Path

# A rank that dies of SIGSEGV, SIGBUS, SIGFPE or SIGABRT prints every thread's Python stack on stderr first (a
# native crash in torch, mpi4py or Open MPI's start-up otherwise leaves one libc frame: the cold runs' SLURM MPI case).
try:
    faulthandler.enable(all_threads=True)
except (RuntimeError, ValueError, OSError):  # a stderr without a file descriptor (an embedding host): no dump
    pass

if __package__ in (None, ""):
    # Run as a script (`python training/train.py`, cwd = a copy of training/ and nothing else): our siblings are
    # imported relatively, as a package named after this directory (training/ in the repository and on a node),
    # from its parent; training/ itself comes off the path so its module names (config, snapshot, ...) cannot
    # shadow anyone's.
    import importlib

    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))
    __package__ = _here.name
    importlib.import_module(__package__)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from . import channel, dist_env  # noqa: E402
from .config import Config, ConfigError, load  # noqa: E402
from .survivor import peer_failed, said_peer_failed  # noqa: E402


def make_deterministic() -> None:
    """``--deterministic``: deterministic algorithms, cuDNN's autotuner off, and cuBLAS's workspace fixed, as
    PyTorch's reproducibility notes say (docs/source/notes/randomness.rst: ``torch.use_deterministic_algorithms``,
    ``torch.backends.cudnn.benchmark = False`` and, on CUDA 10.2 or later, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``;
    pytorch PR 161749 dropped torch's check that the variable is set, the value still fixes cuBLAS's workspace),
    set before the first cuBLAS call (a user's value is kept). ``warn_only``: an op that has no deterministic
    implementation warns, naming itself ("... does not have a deterministic implementation"), instead of stopping
    the run (``torch.use_deterministic_algorithms``' docstring lists ``NLLLoss`` on CUDA among them, and our
    classifiers' cross-entropy is one): whether such a run is bitwise is for a rerun to show (docs/gpu.md)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of a model's state (every tensor's bytes, in the state dict's order), whatever its dtypes."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(cfg: Config, launch: dist_env.Launch) -> torch.device:
    wanted = cfg.training.device
    has_gpu = torch.cuda.is_available()  # true on ROCm builds too
    if wanted == "gpu" and not has_gpu:
        raise ConfigError("--device gpu but this node has no usable GPU (torch.cuda.is_available() is False); use --device cpu")
    if wanted == "gpu" or (wanted == "auto" and has_gpu):
        return torch.device("cuda", launch.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def plan(cfg: Config, launch: dist_env.Launch, device: torch.device) -> tuple[str, str]:
    """(torch backend, gradient data plane), checked before anything starts."""
    d = cfg.distributed
    backend = dist_env.resolve_backend(d.backend, launch, device.type == "cuda")
    if backend == "mpi" and not dist.is_mpi_available():
        raise ConfigError("backend=mpi but this torch has no MPI backend (stock wheels); use backend=auto (MPI data plane via mpi4py)")
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("backend=nccl needs a GPU; use backend=gloo on CPU")
    if backend == "gloo" and not dist.is_gloo_available():
        raise ConfigError("backend=gloo is not available in this torch build")
    plane = d.data_plane
    if plane == "auto":
        plane = "mpi" if launch.launcher == "mpirun" and backend != "mpi" else "ddp"
    if plane == "mpi" and launch.launcher != "mpirun":
        raise ConfigError(f"data_plane=mpi needs mpirun, but we were started by {launch.launcher}; use data_plane=ddp")
    if d.strategy == "single" and launch.distributed:
        raise ConfigError(f"strategy=single but the launcher started {launch.world_size} processes; use strategy=auto")
    if d.strategy == "ddp" and not launch.distributed:
        raise ConfigError("strategy=ddp but this is a single process; start it with torchrun or mpirun")
    return backend, plane


def hello(world: dist_env.World, device: torch.device) -> dict:
    rank, size = world.rank, world.world_size
    print(f"hello from rank {rank}/{size} local_rank {world.local_rank} host {socket.gethostname()} pid {os.getpid()}",
          flush=True)
    value = torch.tensor([float(rank)], device=device if world.backend == "nccl" else "cpu")
    if world.backend is not None:
        dist.all_reduce(value)
    expected = size * (size - 1) / 2
    result = {"rank_sum": value.item(), "expected": expected, "collective_ok": value.item() == expected}
    if world.comm is not None:  # under mpirun, the MPI data plane's own allreduce too
        result["mpi_rank_sum"] = world.comm.allreduce(rank)
        result["collective_ok"] = result["collective_ok"] and result["mpi_rank_sum"] == expected
    return result


def data_plane_name(trainer, world: dist_env.World) -> str:
    """What averaged the gradients: gloo-ddp, nccl-ddp, mpi-backend, mpi4py-allreduce(host|cuda-aware|...)."""
    if trainer.mpi is not None:
        return trainer.mpi.kind
    if world.backend is None:
        return "none"
    return "mpi-backend" if world.backend == "mpi" else f"{world.backend}-ddp"


def setup_logging(rank: int) -> None:
    # torchrun (via the orchestrator) already prefixes each line with its rank; don't say it twice.
    prefix = "" if os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") else f"[rank {rank}] "
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=prefix + "%(message)s",
                        stream=sys.stdout)


def spawn_ranks(cfg: Config, launch: dist_env.Launch, argv: list[str] | None) -> int:
    """``--spawn N`` in a process no launcher started: every rank's checks once, then N ranks of :func:`main`."""
    if launch.distributed:
        raise ConfigError(f"--spawn {cfg.distributed.spawn} but {launch.launcher} already started "
                          f"{launch.world_size} processes; drop --spawn or the launcher")
    as_rank = dist_env.Launch("spawn", 0, cfg.distributed.spawn, 0, "127.0.0.1")
    plan(cfg, as_rank, pick_device(cfg, as_rank))  # every rank's checks, once, before anything starts
    from . import spawn

    return spawn.run(main, sys.argv[1:] if argv is None else list(argv), cfg.distributed.spawn,
                     cfg.distributed.timeout)


def run_workload(cfg: Config, world: dist_env.World, workload, device: torch.device, plane: str,
                 result: dict) -> int:
    """Our Trainer on ``workload``, its figures added to ``result``; 0, or the exit code of a run stopped
    early: 3 by ``--stop-after-epoch``, 75 (``preempt.EXIT_PREEMPTED``) by a notice."""
    from .checkpoint import finish_uploads
    from .faults import Faults
    from .membership import Left
    from .preempt import EXIT_PREEMPTED
    from .trainer import Preempted, StoppedAfterEpoch, Trainer

    log = logging.getLogger("training")
    t = cfg.training
    log.info("%s: %s, world size %d, backend %s, %d epochs", t.workload, world.launch.launcher,
             world.world_size, world.backend or "none", t.total_epochs)
    trainer = Trainer(cfg, world, workload, device, plane, Faults.of(t))  # logs the global batch (a resume keeps its own)
    result.update(epochs=t.total_epochs, seed=t.seed, batch_size=t.batch_size,
                  global_batch=trainer.plan.global_batch, accum=trainer.plan.accum)
    result["data_plane"] = data_plane_name(trainer, world)
    result["amp"] = str(trainer.amp_dtype).removeprefix("torch.") if trainer.amp_dtype else "off"
    try:
        result.update(trainer.train())
        if world.backend is not None:  # every rank: the job's gather
            digests = trainer.world.gather(weights_digest(trainer.model))  # the world it ended in
            result.update(weights_sha256=digests[0], ranks_weights_equal=len(set(digests)) == 1)
    except StoppedAfterEpoch as stop:
        log.warning("%s", stop)
        return 3
    except Preempted as stop:
        log.warning("%s: exit %d (preempted, not failed)", stop, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    except Left as gone:  # the job goes on without this node (a notice): nothing to keep, the others hold it all
        log.warning("%s: exit %d (preempted, not failed)", gone, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    finally:
        result.update(finish_uploads(trainer))
        trainer.close()
        del trainer
        gc.collect()
    return 0


def _check_grace() -> None:
    from . import preempt

    try:
        for setting in (preempt.grace_from_env, preempt.poll_from_env, preempt.margin_from_env):
            setting()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def main(argv: list[str] | None = None, launch: dist_env.Launch | None = None) -> int:
    """Parse, plan, train. ``launch`` is given only to a rank that ``--spawn`` started."""
    try:
        cfg = load(argv)
        _check_grace()
        if cfg.training.deterministic:
            make_deterministic()
        spawned = launch is not None
        launch = launch or dist_env.detect(os.environ)
        if cfg.distributed.spawn and not spawned:
            return spawn_ranks(cfg, launch, argv)
        device = pick_device(cfg, launch)
        backend, plane = plan(cfg, launch, device)
        from . import workloads

        seed_everything(cfg.training.seed)  # before the model exists: its initial weights follow the seed
        workload = None if cfg.training.workload == "hello" else workloads.build(cfg.training)
    except ConfigError as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        world = dist_env.init(launch, backend, cfg.distributed.timeout)
    except Exception as err:  # the job's store or group not formed: a peer gone, or slower than the timeout
        if launch.launcher == "mpirun" or not peer_failed(err):
            raise
        return said_peer_failed(cfg.distributed.timeout)
    setup_logging(world.rank)
    log = logging.getLogger("training")
    t = cfg.training
    result = {"workload": t.workload, "launcher": world.launch.launcher, "world_size": world.world_size,
              "backend": world.backend or "none", "device": device.type}
    if t.amp != "off" and device.type != "cuda":
        log.warning("--amp %s ignored: mixed precision is for GPUs, this run is on %s", t.amp, device.type)
    try:
        if workload is None:
            world.join(cfg.distributed.timeout)  # a new node's rank: nothing to build first
            result.update(hello(world, device))
        else:
            code = run_workload(cfg, world, workload, device, plane, result)
            if code:
                return code
        if world.rank == 0:
            channel.send(channel.RESULT, result)
        ok = result.get("collective_ok", True)
    except Exception as err:
        if world.backend is None or world.comm is not None or not peer_failed(err):
            raise  # mpirun's runtime ends every rank of a job that lost one: nothing to start again
        return said_peer_failed(cfg.distributed.timeout)
    finally:
        if world.backend is not None and dist.is_initialized():
            dist.destroy_process_group()
    return 0 if ok else 1


def exit_now(code: int) -> None:
    """End the process with ``code`` once its output is out, skipping the interpreter's teardown: after every rank
    printed its last line and destroyed its process group, a rank sometimes still died in the C++ teardown at
    interpreter exit (``terminate called without an active exception``, exit 134: seen three times on 2026-11-24
    with torch 2.13 + gloo, after ``RESULT``; pytorch issue 190489 and the abandoned atexit fix of pytorch PR 179291
    describe it). It leaves with ``os._exit`` after flushing its logs, its streams and MPI (mpi4py finalizes at exit
    otherwise, and mpirun calls a rank that skipped ``MPI_Finalize`` a failure)."""
    logging.shutdown()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said on it
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
