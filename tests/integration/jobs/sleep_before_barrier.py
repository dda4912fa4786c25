"""A user's script whose one rank sleeps in Python before a barrier while its peers wait in it.

    sleep_before_barrier.py [--sleepy-rank 1] [--seconds 600] [--timeout 300]

Every rank joins a first barrier (all are up), prints ``USER rank=R host=H pid=P sleeps|waits``, then the sleepy
rank sleeps ``--seconds`` in ``time.sleep`` (state S, on the same line at every look, outside any collective) while
the others wait in the second barrier. Nothing prints, no CPU is spent: only the stall watchdog (STALL_TIMEOUT)
ends it before the process-group timeout (``--timeout``, longer than the stall timeout on purpose).
"""

import argparse
import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--sleepy-rank", type=int, default=1)
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
rank = dist.get_rank()
dist.barrier()
what = "sleeps" if rank == args.sleepy_rank else "waits"
print(f"USER rank={rank} host={socket.gethostname()} pid={os.getpid()} {what}", flush=True)
if rank == args.sleepy_rank:
    time.sleep(args.seconds)
dist.barrier()
dist.destroy_process_group()
