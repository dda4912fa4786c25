"""The trainer's first MPI steps (training/dist_env.py ``init``): MPI_Init on import, Split_type, an allreduce and a
bcast -- where a rank started by ``srun --mpi=pmix`` met the start-up SIGSEGV (bench.mpistart)."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
local = comm.Split_type(MPI.COMM_TYPE_SHARED)
nodes = comm.allreduce(1 if local.Get_rank() == 0 else 0)
comm.bcast(("endpoint", 1), root=0)
local.Free()
if comm.Get_rank() == 0:
    print(f"ok {nodes} nodes", flush=True)
