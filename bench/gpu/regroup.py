"""A process group at world size 1 made, used, left, and a new one made in the same process: the path the survivors
of a lost node take when they keep running instead of restarting.

    python -m bench.gpu.regroup --backend nccl --leave abort_process_group|backend_abort|destroy

Generation 0: ``init_process_group`` (NCCL: with ``device_id``, so the communicator exists at once) on a prefix of
one TCP store, an ``all_reduce`` checked, then the group left one way (:data:`LEAVE`), then a collective on the left
group (on record: whether it raises, returns or hangs), then generation 1 on a fresh prefix of the same store (torch's PrefixStore:
a new group never reads the old one's keys), its ``all_reduce`` checked, and ``destroy_process_group``.
NCCL's error handling is the trainer's (training/dist_env.py, ``nccl_environment``). Every step prints
``STEP {json}`` at once (name, ok, seconds, error); a step that does not return within its limit is recorded as hung
and the next one runs. The process ends with ``os._exit`` (a hung thread must not hold it). Which abort calls this torch has is
printed first (``APIS {json}``).

The calls, in torch 2.13's torch/distributed/distributed_c10d.py: ``_abort_process_group(group=None)`` ("experimental
and currently only works with the NCCL backend"; for WORLD it aborts every group inside one ncclGroupStart/End and
forgets them, as ``destroy_process_group`` does); ``destroy_process_group()`` shuts every backend down
(``pg.shutdown()``) and forgets them. ``ProcessGroupNCCL.abort`` is the backend's own binding ("Abort the process
group.", torch/csrc/distributed/c10d/init.cpp); after it the group is still registered and is destroyed as usual.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta

STEP_LIMIT = 30.0  # seconds one step may take
OLD_GROUP_LIMIT = 10.0  # seconds a collective on the left group may take (an aborted communicator must not hang)
LEAVE = ("abort_process_group", "backend_abort", "destroy")


def announce(marker: str, payload: dict) -> None:
    sys.stdout.write(f"{marker} {json.dumps(payload)}\n")
    sys.stdout.flush()


class Steps:
    """Each step runs in a thread of its own and prints its record at once; a step that has not returned within its
    limit is recorded as hung (its thread is left behind) and the next step runs."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def __call__(self, name: str, fn, expect_error: bool = False, informative: bool = False,
                 limit: float = STEP_LIMIT):
        box: dict = {}

        def body() -> None:
            try:
                box["value"] = fn()
            except Exception as err:  # recorded: what torch raised is the finding
                text = str(err).strip()
                box["error"] = f"{type(err).__module__}.{type(err).__qualname__}: {text.splitlines()[0][:300] if text else ''}"

        start = time.monotonic()
        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        thread.join(limit)
        hung = thread.is_alive()
        error = f"did not return within {limit:g} s" if hung else box.get("error")
        raised = not hung and "error" in box
        record = {"step": name, "ok": raised if expect_error else (not hung and error is None),
                  "seconds": round(time.monotonic() - start, 3), "error": error, "expect_error": expect_error,
                  "informative": informative}
        if isinstance(box.get("value"), (int, float, str, bool)):  # objects stay out of the record
            record["value"] = box["value"]
        announce("STEP", record)
        self.records.append(record)
        return box.get("value")


def apis() -> dict:
    """Which of the calls this torch has."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    return {"ProcessGroupNCCL.abort": bool(nccl and hasattr(nccl, "abort")),
            "ProcessGroupNCCL.shutdown": bool(nccl and hasattr(nccl, "shutdown")),
            "ProcessGroup.abort": hasattr(dist.ProcessGroup, "abort"),
            "distributed_c10d._abort_process_group": hasattr(c10d, "_abort_process_group"),
            "distributed_c10d.shrink_group": hasattr(c10d, "shrink_group"),
            "distributed_c10d.destroy_process_group": hasattr(c10d, "destroy_process_group")}


def collective_on(group, device) -> float:
    """An all-reduce straight on the ProcessGroup object (the group may no longer be registered); its sum."""
    import torch

    tensor = torch.full((1024,), 3.0, device=device)
    group.allreduce([tensor]).wait()
    return float(tensor.sum().item())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.regroup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--leave", choices=LEAVE, required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    from training import dist_env

    dist_env.nccl_environment(os.environ)  # as the trainer has it
    cuda = args.backend == "nccl"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    announce("APIS", {**apis(), "torch": torch.__version__, **dist_env.nccl_environment(os.environ)})
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    step = Steps()

    def init(generation: int):
        def make():
            extra = {"device_id": device} if cuda else {}
            dist.init_process_group(args.backend, store=dist.PrefixStore(f"generation-{generation}", store), rank=0,
                                    world_size=1, timeout=timedelta(seconds=20), **extra)
        return make

    def all_reduce(group=None):
        def reduce():
            tensor = torch.full((1024,), 3.0, device=device)
            dist.all_reduce(tensor, group=group)
            value = float(tensor.sum().item())  # waits for the collective
            if value != 3.0 * 1024:
                raise AssertionError(f"all_reduce at world size 1 gave a sum of {value}, not {3.0 * 1024}")
            return value
        return reduce

    step("generation 0: init_process_group", init(0))
    step("generation 0: all_reduce", all_reduce())
    old = dist.group.WORLD
    if args.leave == "abort_process_group":
        step("leave: distributed_c10d._abort_process_group()", lambda: dist.distributed_c10d._abort_process_group())
    elif args.leave == "backend_abort":
        step("leave: the group's backend .abort()", lambda: old._get_backend(device).abort())
    else:
        step("leave: destroy_process_group()", lambda: dist.destroy_process_group())
    # On record, not in the verdict: what matters to the survivors is that they can leave and form a new group.
    step("a collective on the left group", lambda: collective_on(old, device), expect_error=True, informative=True,
         limit=OLD_GROUP_LIMIT)
    if args.leave == "backend_abort":
        step("leave: destroy_process_group() after the abort", lambda: dist.destroy_process_group())
    step("generation 1: init_process_group (same process, new store prefix)", init(1))
    step("generation 1: all_reduce", all_reduce())
    step("generation 1: destroy_process_group()", lambda: dist.destroy_process_group())
    announce("REGROUP", {"backend": args.backend, "leave": args.leave, "steps": step.records,
                         "ok": all(r["ok"] for r in step.records if not r["informative"])})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
