"""A user's torchrun script whose one rank hangs after a few steps while the others wait in all_reduce.

    user_hang.py --hang-rank 2 --how spin|lock|none|mismatch [--after 3] [--timeout 10] [--heartbeat]

spin: the rank loops in Python forever (CPU-bound, state R); lock: it blocks on a lock no one releases,
right before its next collective (state S); none: it keeps stepping (to be SIGSTOPped from outside);
mismatch: the rank calls all_reduce while the others call broadcast (every rank waits, in different
collectives). The other ranks block in all_reduce (broadcast) until the process-group timeout.
"""

import argparse
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--how", choices=("spin", "lock", "none", "mismatch"), default="none")
parser.add_argument("--after", type=int, default=3, help="steps before the hang")
parser.add_argument("--steps", type=int, default=-1, help="-1: forever")
parser.add_argument("--sleep", type=float, default=0.2)
parser.add_argument("--timeout", type=float, default=10, help="process-group timeout, seconds")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
rank = dist.get_rank()
guard = threading.Lock()


def spin_forever() -> None:
    total = 0
    while True:
        total += 1


def wait_for_the_lock() -> None:
    guard.acquire()
    guard.acquire()  # never released: blocks here, before the next collective


def step_collective(step: int) -> None:
    """all_reduce every step; under --how mismatch, from step --after on, every rank but the hanging one calls
    broadcast instead (a bug where ranks take different code paths)."""
    if args.how == "mismatch" and step >= args.after and rank != args.hang_rank:
        dist.broadcast(torch.ones(1), src=args.hang_rank)
    else:
        dist.all_reduce(torch.ones(1))


step = 0
while args.steps < 0 or step < args.steps:
    if rank == args.hang_rank and step == args.after:
        print(f"USER rank={rank} pid={os.getpid()} hangs now ({args.how})", flush=True)
        {"spin": spin_forever, "lock": wait_for_the_lock, "none": lambda: None, "mismatch": lambda: None}[args.how]()
    step_collective(step)
    print(f"USER step {step} rank={rank}", flush=True)
    time.sleep(args.sleep)
    step += 1
dist.destroy_process_group()
