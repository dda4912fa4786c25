"""A user's own training loop that asks for a coordinated stop with ``training.preempt.guard()``: on a notice
(here SIGTERM with MULTINODE_GRACE) every rank stops at the same step, rank 0 saves, all exit 75."""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

from training import preempt


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weights = torch.zeros(10)
    with preempt.guard() as stop:
        for step in range(1, args.steps + 1):
            grad = torch.full((10,), float(rank + 1))
            dist.all_reduce(grad)
            weights -= 0.001 * grad
            if rank == 0 and step % 10 == 0:
                print(f"step {step} ", flush=True)
            time.sleep(0.01)
            if stop.now():
                print(f"preempted: every rank stops at epoch 0 batch {step} (step {step})", flush=True)
                if rank == 0:
                    torch.save({"step": step, "weights": weights}, args.out)
                dist.barrier()
                dist.destroy_process_group()
                return preempt.EXIT_PREEMPTED
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
