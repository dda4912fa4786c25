"""A plain env:// script, as a user writes it for torchrun: no MPI in it. Under MODE=mpi it runs unchanged
because every rank gets MASTER_ADDR/MASTER_PORT and RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE.

    env_contract.py     prints "CONTRACT rank=.. world=.. local=.. local_world=.. group=.. master=ADDR:PORT
                        sum=.. ompi_rank=.. omp=.. unbuffered=.. gloo_if=.." after an all_reduce of ones
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

env = os.environ
# What the rank started with (before any MPI or torch call could set anything).
started = {name: env.get(name, "unset") for name in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "GLOO_SOCKET_IFNAME")}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
assert (dist.get_rank(), dist.get_world_size()) == (rank, world)
total = torch.ones(1)
dist.all_reduce(total)
print(f"CONTRACT rank={rank} world={world} local={env['LOCAL_RANK']} local_world={env['LOCAL_WORLD_SIZE']} "
      f"group={env['GROUP_RANK']} master={env['MASTER_ADDR']}:{env['MASTER_PORT']} sum={int(total.item())} "
      f"ompi_rank={env.get('OMPI_COMM_WORLD_RANK', 'unset')} omp={started['OMP_NUM_THREADS']} "
      f"unbuffered={started['PYTHONUNBUFFERED']} gloo_if={started['GLOO_SOCKET_IFNAME']}", flush=True)
dist.destroy_process_group()
