"""Who started us, and the process group that follows from it.

:func:`detect` is pure (environment in, :class:`Launch` out):

* torchrun: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR`` set by the agent;
* mpirun (Open MPI, MPICH, Intel MPI): ``OMPI_COMM_WORLD_*`` / ``PMI_*`` / ``PMIX_RANK``; rank, size and
  local rank then come from MPI itself (mpi4py), not from the environment;
* SLURM ``srun``: ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``; the rendezvous is ``MASTER_ADDR``
  if set, else the node srun was launched from;
* none of these: one process (``train.py --spawn N`` then starts N ranks itself, see ``spawn.py``,
  and hands each its :class:`Launch` with launcher ``spawn``).

:func:`init` creates the torch process group. Under MPI, rank 0 starts a TCP store on a port the
kernel picks and broadcasts its address and that port over MPI, so no ``MASTER_ADDR`` is needed (and
no port race); the address is the one on ``GLOO_SOCKET_IFNAME`` when set. torch's MPI backend is used
when this torch has it. Under MPI an uncaught exception aborts the whole job (``MPI_Abort``): without
that, the failed rank waits in ``MPI_Finalize`` while its peers wait in an allreduce, forever.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

from . import membership

MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
# NCCL's watchdog on a failed or timed-out collective: 2 = CleanUpOnly, the communicators aborted and the error raised
# in the training loop (torch's ErrorHandlingMode in torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp: NoHandling 0,
# TearDown 1, CleanUpOnly 2, SkipCleanUp 3, "the default value (3 - SkipCleanUp)"; SHOULD_TEAR_DOWN is false only for
# 0 and 2), where the process would otherwise be torn down before the surviving ranks could keep their state.
# A value the user set is kept.
NCCL_ERROR_HANDLING = "2"
# Before it aborts the communicators and raises, the watchdog sleeps four times TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
# (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, Watchdog::runLoop: ``sleep_for(getDumpTimeout() * 4)``, "to let
# all ranks ... dump" the flight recorder; HeartbeatMonitor: ``getCvarInt(TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC, 15 *
# 1000)``): a minute by default, after the process-group timeout, during which the survivors of a lost peer keep
# nothing and a recovery's grace (PG_TIMEOUT + 15 s, docs/recovery.md) runs out. Measured on an H200 with torch 2.11
# (docs/gpu.md, bench/gpu/timeout.py; a 5 s timeout, the collective's stream held 15 s): the error reached Python 65.8 s
# after the hold began with torch's default, 15.1 s (when the hold ended) with 1000 ms: 4 s. A user's value is kept.
NCCL_DUMP_WAIT_MS = "1000"


def nccl_environment(environ=os.environ) -> dict[str, str]:
    """Set NCCL's error handling as the trainer wants it (a value already set is kept); the values in effect."""
    environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ERROR_HANDLING)
    environ.setdefault("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", NCCL_DUMP_WAIT_MS)
    return {k: environ[k] for k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")}


@dataclass(frozen=True)
class Launch:
    launcher: str  # torchrun | env (the env:// contract without torchrun's agent) | mpirun | slurm | spawn | single
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def detect(env: Mapping[str, str]) -> Launch:
    # MPI first: multinode's mpirun launch also gives every rank the env:// variables (derived from
    # OMPI_COMM_WORLD_*), for scripts that read them; MPI itself stays the truth for our trainer.
    if any(marker in env for marker in MPI_MARKERS):
        rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", env.get("PMIX_RANK", 0))))
        size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", 1)))
        local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", env.get("MPI_LOCALRANKID", 0)))
        return Launch("mpirun", rank, size, local)
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        # torchrun's agent also sets TORCHELASTIC_RUN_ID; multinode's static launch, DeepSpeed's
        # launcher or a hand-typed line give only the env:// variables.
        name = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        return Launch(name, int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                      env["MASTER_ADDR"], int(env.get("MASTER_PORT", 29500)))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR")
        return Launch("slurm", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                      addr, int(env.get("MASTER_PORT", 29500)))
    return Launch("single")


def interface_address(name: str) -> str:
    """IPv4 address of a network interface (Linux SIOCGIFADDR)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def my_address() -> str:
    """The address peers reach this process at: the pinned interface's, else the hostname's."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    if iface:
        return interface_address(iface.split(",")[0])
    return socket.gethostbyname(socket.gethostname())


@dataclass
class World:
    """The running job: who we are, the MPI communicator when MPI launched us, and our place in the job's membership
    when the run may change it while we run (:mod:`training.membership`)."""

    launch: Launch
    backend: str | None  # torch process-group backend; None when single
    comm: Any = None  # mpi4py COMM_WORLD under mpirun
    member: Any = None  # training.membership.Member, with MULTINODE_MEMBERSHIP under the static launcher
    joining: Any = None  # a new node's rank: the training.membership.Place it joins the running job at (join())

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    def join(self, timeout: float) -> None:
        """A new node's rank, once it is ready to take its peers' state: says so and forms the group of the
        generation that takes it in (:meth:`training.membership.Member.join`). Nothing for any other rank.

        Called when everything the rank builds before the state's transfer is built (the trainer's model,
        optimizer...): the running ranks pause when the run opens that generation, and what the new rank did
        after saying JOINING they would wait for -- the first optimizer alone imports torch._dynamo (1.4 s in
        cProfile on the 2-core machine of docs/benchmarks.md)."""
        if self.joining is not None:
            self.member.join(self.joining, self.backend, timeout)
            self.joining = None

    def broadcast(self, obj, src: int = 0):
        """``obj`` as rank ``src`` has it, on every rank (itself where there is no process group)."""
        if self.backend is None:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.backend is None:
            return [obj]
        import torch.distributed as dist

        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, obj)
        return everyone

    def all_sum(self, values: list[float], device) -> list[float]:
        """``values`` summed over the ranks (float64; on ``device`` under NCCL)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        if self.backend is not None:
            if self.backend == "nccl":
                tensor = tensor.to(device)
            dist.all_reduce(tensor)
        return tensor.cpu().tolist()


def resolve_backend(requested: str, launch: Launch, use_gpu: bool) -> str:
    import torch.distributed as dist

    if requested == "auto":
        if launch.launcher == "mpirun" and dist.is_mpi_available():
            return "mpi"
        return "nccl" if use_gpu else "gloo"
    return requested


def abort_on_uncaught_exception(comm) -> None:
    """What ``python -m mpi4py`` does: an uncaught exception on any rank ends every rank."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        comm.Abort(1)

    sys.excepthook = hook


def mpi_rendezvous(comm, rank: int, world_size: int, nodes: int, timeout: timedelta):
    """A torch TCP store whose endpoint rank 0 broadcasts over MPI (rank 0 hosts it)."""
    import torch.distributed as dist

    if rank == 0:
        address = my_address()
        if address.startswith("127.") and nodes > 1:
            raise RuntimeError(f"this host's name resolves to {address} but the job spans {nodes} nodes; "
                               "export GLOO_SOCKET_IFNAME=<cluster interface> (mpirun -x GLOO_SOCKET_IFNAME)")
        # The store named by the address the others dial (not 0.0.0.0): then it listens where they connect, and the
        # peers it sees are IPv4 addresses the nodes' hosts files name (c10d's "hostname of the client socket
        # cannot be retrieved" otherwise, on every rank; measured on local nodes, 2 nodes MODE=mpi).
        store = dist.TCPStore(address, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        endpoint = comm.bcast((address, store.port), root=0)
    else:
        endpoint = comm.bcast(None, root=0)
        store = dist.TCPStore(endpoint[0], endpoint[1], world_size, is_master=False, timeout=timeout)
    return store


def init(launch: Launch, backend: str, timeout: float) -> World:
    """Create the process group (nothing for one process; a new node's rank forms it at :meth:`World.join`)."""
    import torch.distributed as dist

    comm = None
    if launch.launcher == "mpirun":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        abort_on_uncaught_exception(comm)
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        launch = Launch("mpirun", comm.Get_rank(), comm.Get_size(), local.Get_rank())
        nodes = comm.allreduce(1 if local.Get_rank() == 0 else 0)
        local.Free()
    if not launch.distributed:
        return World(launch, None, comm)
    pg_timeout = timedelta(seconds=timeout)
    if backend == "nccl":  # a lost peer raises in the loop, for the survivors' snapshot (training/survivor.py)
        nccl_environment(os.environ)
    if comm is not None and backend == "mpi":
        dist.init_process_group("mpi", timeout=pg_timeout)
    elif comm is not None:
        store = mpi_rendezvous(comm, launch.rank, launch.world_size, nodes, pg_timeout)
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=pg_timeout)
    elif launch.launcher == "env" and membership.path_from_env() is not None:
        return _with_membership(launch, backend, timeout)
    elif launch.launcher == "spawn":  # the parent hosts the store, as torchrun's agent does
        store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size, is_master=False,
                              timeout=pg_timeout)
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=pg_timeout)
    else:
        os.environ.setdefault("MASTER_ADDR", launch.master_addr or "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(launch.master_port or 29500))
        dist.init_process_group(backend, init_method="env://", rank=launch.rank,
                                world_size=launch.world_size, timeout=pg_timeout)
    return World(launch, backend, comm)


def _with_membership(launch: Launch, backend: str, timeout: float) -> World:
    """The static launcher's ranks when the run may change the membership: the job's store hosted by rank 0 for the
    job's life, the group of this generation under its prefix (:mod:`training.membership`). A rank of a node started
    to join a running job takes its place from the run's file, and joins when it is ready (:meth:`World.join`)."""
    member, place = membership.first_place(launch, membership.path_from_env())
    member.connect(launch.master_addr or "127.0.0.1", launch.master_port or 29500,
                   rank0=place.generation == 0 and place.rank == 0, timeout=timeout)
    if place.generation > 0:
        launch = Launch(launch.launcher, place.rank, place.world_size, launch.local_rank, launch.master_addr,
                        launch.master_port)
        return World(launch, backend, None, member, joining=place)
    member.form(place, backend, timeout)
    return World(launch, backend, None, member)

