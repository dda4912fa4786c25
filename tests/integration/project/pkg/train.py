"""pkg.train: data-parallel SGD on pkg.model, configured by config.yaml (read relative to the working directory).

    torchrun ... -m pkg.train            (or pkg/train.py; env:// from torchrun or LAUNCHER=static)
    mpirun ... python -m pkg.train       (gradients averaged with mpi4py)
"""

import gc
import hashlib
import importlib.metadata
import os
import socket
from datetime import timedelta
from pathlib import Path

import termcolor  # not in the cluster's environment: SETUP installs it from requirements.txt
import torch
import yaml

from pkg.model import batch, make_model

config = yaml.safe_load(Path("config.yaml").read_text())

if "OMPI_COMM_WORLD_RANK" in os.environ:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    model = make_model()
    total = comm.allreduce(rank + 1)

    def average_gradients() -> None:
        for param in model.parameters():
            comm.Allreduce(MPI.IN_PLACE, param.grad.numpy(), op=MPI.SUM)  # the numpy view shares memory
            param.grad /= world
else:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(make_model())  # averages gradients itself
    summed = torch.tensor([rank + 1])
    dist.all_reduce(summed)
    total = int(summed.item())

    def average_gradients() -> None:
        pass

optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
for _ in range(config["steps"]):
    optimizer.zero_grad()
    inputs, target = batch(rank, config["batch"], config["target"])
    torch.nn.functional.mse_loss(model(inputs), target).backward()
    average_gradients()
    optimizer.step()

weights = sum(float(p.detach().sum()) for p in model.parameters())
print(f"PROJECT rank={rank} world={world} host={socket.gethostname()} sum={total} expected={world * (world + 1) // 2} "
      f"weights={weights:.6f} name={config['name']}", flush=True)
print(f"DEP rank={rank} termcolor={importlib.metadata.version('termcolor')} at={termcolor.__file__}", flush=True)


def digest(name: str) -> str:
    """What the ranks saw of a variable, without printing its value."""
    value = os.environ.get(name)
    return "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()[:16]


print(f"ENVCHECK rank={rank} token={digest('PROJECT_TOKEN')} mode={digest('PROJECT_MODE')}", flush=True)

if "OMPI_COMM_WORLD_RANK" not in os.environ:
    # A gloo group left to the interpreter's exit can abort the rank ("terminate called without an active
    # exception", exit 134) on a loaded machine: end it as a torch script should.
    dist.barrier()
    # DDP's reducer holds the group: it goes first, or the group's threads can outlive it into the interpreter's
    # shutdown and abort the rank after all its output (seen here twice, in a container and on a host node).
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
