"""A user's torchrun script that is not ours: all_reduce of (rank+1)*value, then optional steps.

    torchrun ... user_allreduce.py --value 3 [--steps N | --steps -1 (forever)] [--sleep S] [--until PATH]

``--until PATH``: the steps go on until PATH exists (a test's word that it has looked at the running job), every
rank stopping at the same step (each step's all-reduce carries whether any rank has seen it).
"""

import argparse
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--value", type=int, default=1)
parser.add_argument("--steps", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.2)
parser.add_argument("--timeout", type=float, default=20, help="process-group timeout, seconds")
parser.add_argument("--until", help="go on stepping until this file exists")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([args.value * (rank + 1)])
dist.all_reduce(total)
expected = args.value * world * (world + 1) // 2
print(f"USER rank={rank} world={world} host={socket.gethostname()} pid={os.getpid()} sum={total.item()} "
      f"expected={expected}", flush=True)
step = 0
while args.steps < 0 or step < args.steps or args.until:
    seen = torch.tensor([1.0 if args.until and os.path.exists(args.until) else 0.0])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    if seen.item() and step >= args.steps:
        break
    print(f"USER step {step} rank={rank}", flush=True)
    time.sleep(args.sleep)
    step += 1
dist.destroy_process_group()
