"""A user's torchrun script that is not ours: all_reduce of (rank+1)*value, then optional steps.

    torchrun ... user_allreduce.py --value 3 [--steps N | --steps -1 (forever)] [--sleep S]
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
args = parser.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([args.value * (rank + 1)])
dist.all_reduce(total)
expected = args.value * world * (world + 1) // 2
print(f"USER rank={rank} world={world} host={socket.gethostname()} pid={os.getpid()} sum={total.item()} "
      f"expected={expected}", flush=True)
step = 0
while args.steps < 0 or step < args.steps:
    dist.all_reduce(torch.ones(1))
    print(f"USER step {step} rank={rank}", flush=True)
    time.sleep(args.sleep)
    step += 1
dist.destroy_process_group()
