"""The launch-overhead job: join the process group, one barrier, print the wall clock, exit.

Every rank prints ``RDZV <rank> <unix time>`` right after the barrier, so "all ranks rendezvoused"
is the largest of these times (the nodes of a local cluster share one clock). Works under torchrun
(env:// variables) with gloo; imports nothing but torch.
"""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
# One write per line: ranks of one node may share a pipe, and print() writes the newline separately.
sys.stdout.write(f"RDZV {dist.get_rank()} {time.time():.6f}\n")
sys.stdout.flush()
dist.destroy_process_group()
