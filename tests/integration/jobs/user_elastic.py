"""A user's own loop that keeps running through a membership change with ``training.preempt.Elastic``: plain
torch.distributed, no model class of ours. Each step every rank adds its share of the step's numbers to a running
sum (an all_reduce), the numbers of a step split over however many ranks there are now; at the end rank 0 prints
the sum and how many processes it ran through, which the test checks against the sum of every step's numbers
(nothing missing, nothing twice) -- the same answer whatever the world did meanwhile."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from training import preempt

NUMBERS = 12  # each step's numbers: step * 100 + 0..11, split over the ranks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pace", type=float, default=0.05)
    args = parser.parse_args()
    total = torch.zeros(1, dtype=torch.float64)
    job = preempt.Elastic(state=lambda: {"total": total.clone()}, load=lambda s: total.copy_(s["total"]), timeout=10.0)
    job.start("gloo")
    step = job.position or 0
    while step < args.steps:
        try:
            with job.guard(step):
                mine = [step * 100 + k for k in range(NUMBERS) if k % job.world_size == job.rank]
                part = torch.tensor([float(sum(mine))], dtype=torch.float64)
                dist.all_reduce(part)
                total += part
                time.sleep(args.pace)
            step += 1
            if job.rank == 0 and step % 50 == 0:
                print(f"step {step} on {job.world_size} rank(s)", flush=True)
            if job.done(step):
                return preempt.EXIT_PREEMPTED
        except preempt.Changed as change:
            step = change.position  # the step every rank of the new world starts, the sum as of it
    if job.rank == 0:
        print(f"SUM {int(total.item())} pid {os.getpid()}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
