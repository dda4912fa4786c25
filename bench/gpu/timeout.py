"""Item 6: NCCL's error handling as the trainer sets it, when a collective times out, and the survivors' path after.

    python -m bench.gpu.timeout --backend nccl --work DIR            (the uninterrupted run: DIR/final.pt)
    python -m bench.gpu.timeout --backend nccl --work DIR --fault    (a collective made to time out, then the resume)
    ... --fault --torch-dump-wait   (the same with torch's own TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: the baseline)

Our Trainer (training/trainer.py) over NCCL at world size 1 on cuda:0: DDP, the digits workload, deterministic
algorithms, a snapshot directory (so the survivor path of training/survivor.py is on), NCCL's error handling as
training/dist_env.py sets it (``nccl_environment``), a process-group timeout of ``--timeout`` seconds. One GPU takes one NCCL rank
(NCCL refuses two on one device), so no peer can be missing: with ``--fault`` the ``--fault-call``-th bucket
all-reduce of DDP (torch's ``default_hooks.allreduce_hook``, which the trainer's CommTimer calls) first holds the
CUDA stream the collective waits on with ``torch.cuda._sleep`` for ``--hold`` timeouts, so NCCL's work cannot end
within its timeout and the watchdog times it out, as it would a collective a lost peer never joins.

On record (``STEP`` lines as they happen, ``TIMEOUT {json}`` at the end): whether Python saw an error, of which
type, at which step, whether :func:`training.survivor.lost_peer` takes it for a lost peer; that the process went on
(this line is printed by it); whether the model in memory is readable and equals the snapshot the survivor path kept;
then the survivors' path in the same process: the failed group left (``--leave``: ``destroy_process_group`` or
``_abort_process_group`` first, the other if it fails), a new group on a new store prefix, a new Trainer resumed from the kept snapshot and
trained to the end, its final weights saved in DIR/final.pt (the check compares them with the uninterrupted run's).

On the CPU (``--backend gloo``, the rehearsal) no collective can be made to time out at world size 1: the hook raises
a RuntimeError naming c10d instead, and the rest of the path runs the same.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from bench.gpu.regroup import Steps, announce


class StreamHold:
    """Patches DDP's default all-reduce hook: its ``at_call``-th call first holds the current CUDA stream for
    ``hold_s`` seconds (CPU: raises instead)."""

    def __init__(self, at_call: int, hold_s: float, cuda: bool):
        self.at_call, self.hold_s, self.cuda = at_call, hold_s, cuda
        self.calls, self.fired_at, self.original = 0, None, None

    def install(self) -> None:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        cycles = int(self.hold_s * cycles_per_second()) if self.cuda else 0
        self.original = original = default_hooks.allreduce_hook

        def hook(state, bucket):
            self.calls += 1
            if self.calls == self.at_call:
                self.fired_at = time.monotonic()
                if not self.cuda:
                    raise RuntimeError("[c10d] injected in the CPU rehearsal: the collective timed out")
                torch.cuda._sleep(cycles)  # the stream NCCL's work waits on is busy for hold_s
            return original(state, bucket)

        default_hooks.allreduce_hook = hook

    def remove(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.original is not None:
            default_hooks.allreduce_hook = self.original


def cycles_per_second() -> float:
    """How many ``torch.cuda._sleep`` cycles last a second on this GPU (timed with CUDA events)."""
    import torch

    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    end.synchronize()
    return 100_000_000 / (start.elapsed_time(end) / 1000)


def _error(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__module__}.{type(err).__qualname__}: {text.splitlines()[0][:300] if text else ''}"


class Harness:
    """The trainer over one process group at world size 1, made again in the same process after a failure."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import torch.distributed as dist

        from training import dist_env, preempt, train
        from training.config import load

        self.args, self.cuda = args, args.backend == "nccl"
        train.make_deterministic()
        self.snapshots = args.work / "snapshots"
        self.cfg = load(["--workload", "digits", "--device", "gpu" if self.cuda else "cpu", "--deterministic",
                         "--snapshot-dir", str(self.snapshots), "--timeout", str(args.timeout), str(args.epochs),
                         str(args.epochs)])
        if args.torch_dump_wait:
            os.environ.pop("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", None)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", dist_env.NCCL_ERROR_HANDLING)
        else:
            dist_env.nccl_environment(os.environ)  # as dist_env.init does for NCCL
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        preempt.watch()  # started here, in the main thread
        self.store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        self.record: dict = {"backend": args.backend, "fault": args.fault, "timeout_s": args.timeout,
                             "epochs": args.epochs, "leave_first": args.leave,
                             **{k: os.environ.get(k, "unset") for k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                                        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")}}
        self.step = Steps()

    def group(self, generation: int):
        import torch.distributed as dist

        from training import dist_env

        dist.init_process_group(self.args.backend, store=dist.PrefixStore(f"generation-{generation}", self.store),
                                rank=0, world_size=1, timeout=timedelta(seconds=self.args.timeout))
        return dist_env.World(dist_env.Launch("spawn", 0, 1, 0, "127.0.0.1"), self.args.backend)

    def trainer(self, world):
        from training import train, workloads
        from training.trainer import Trainer

        train.seed_everything(self.cfg.training.seed)  # as train.py: before the model exists
        return Trainer(self.cfg, world, workloads.build(self.cfg.training), self.device, "ddp")

    def save(self, model) -> None:
        import torch

        torch.save(model.state_dict(), self.args.work / "final.pt")

    def until_the_fault(self, first) -> None:
        """Train with the stream held at one all-reduce: what reached Python, where."""
        from training import survivor

        hold = StreamHold(self.args.fault_call, self.args.hold * self.args.timeout, self.cuda)
        hold.install()
        try:
            first.train()
            self.record.update(raised=False)
        except Exception as err:  # the finding
            self.record.update(raised=True, error=_error(err), lost_peer=survivor.lost_peer(err),
                               step_at_error=first.step, seconds_after_fault=round(time.monotonic() - hold.fired_at, 2)
                               if hold.fired_at else None)
        finally:
            hold.remove()
        self.record.update(fault_fired=hold.fired_at is not None, hold_s=hold.hold_s, process_alive=True)
        announce("STEP", {"step": "train until the fault", **self.record})

    def kept_state(self, first) -> None:
        """The model in memory against the snapshot the survivor path kept."""
        import torch

        from training import snapshot

        state = self.step("the model in memory is readable",
                          lambda: {k: v.detach().cpu().clone() for k, v in first.model.state_dict().items()})
        blob = snapshot.read(self.snapshots)
        kept = snapshot.decode(blob) if blob else None
        if kept is not None:
            self.record["kept"] = {"next_epoch": kept["next_epoch"], "consumed": kept["consumed"], "step": kept["step"],
                                   "by_survivor_path": "survivor" in kept, "survivor": kept.get("survivor")}
        self.record["state_equals_kept"] = bool(state and kept) and all(
            torch.equal(state[k], kept["model"][k].cpu()) for k in state)

    def survivors_path(self) -> None:
        """Leave the failed group (--leave first, the other call if it fails), a new group, the resume."""
        import torch.distributed as dist

        calls = {"destroy": ("destroy_process_group()", dist.destroy_process_group),
                 "abort": ("distributed_c10d._abort_process_group()", dist.distributed_c10d._abort_process_group)}
        for name in (self.args.leave, *(k for k in calls if k != self.args.leave)):
            said, call = calls[name]
            if self.step(f"leave the failed group: {said}", lambda call=call: call() or "left") is not None:
                break
        world = self.step("a new group in the same process", lambda: self.group(1))
        if world is not None:
            resumed = self.step("a new Trainer resumes from the kept snapshot and trains to the end",
                                lambda: (lambda t: {"result": t.train(), "trainer": t})(self.trainer(world)), limit=300)
            if resumed:
                self.save(resumed["trainer"].model)
                self.record["result"] = resumed["result"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.timeout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--fault", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5.0, help="the process group's timeout (s)")
    parser.add_argument("--fault-call", type=int, default=60, help="which all-reduce hook call holds the stream")
    parser.add_argument("--hold", type=float, default=3.0, help="how long, in timeouts")
    parser.add_argument("--leave", choices=("destroy", "abort"), default="destroy", help="how the survivor leaves the "
                        "failed group first: destroy_process_group() or distributed_c10d._abort_process_group()")
    parser.add_argument("--torch-dump-wait", action="store_true", help="the baseline: TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC "
                        "left to torch (the trainer's error handling otherwise)")
    harness = Harness(parser.parse_args(argv))
    first = harness.trainer(harness.group(0))
    if not harness.args.fault:
        harness.record["result"] = first.train()
        harness.save(first.model)
    else:
        harness.until_the_fault(first)
        harness.kept_state(first)
        first.close()
        del first
        gc.collect()
        harness.survivors_path()
        harness.record["steps"] = harness.step.records
    announce("TIMEOUT", harness.record)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
