"""A user's mpirun script that is not ours: an MPI allreduce of the ranks with mpi4py."""

import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank)
print(f"USERMPI rank={rank} size={size} host={socket.gethostname()} sum={total} expected={size * (size - 1) // 2}",
      flush=True)
