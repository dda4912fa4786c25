"""All-reduce bandwidth sweep, measured the way nccl-tests' ``all_reduce_perf`` does.

    torchrun ... allreduce_perf.py --backend gloo [--sizes 4096,...]      (torch.distributed, gloo)
    torchrun ... allreduce_perf.py --backend nccl [--sizes 4096,...]      (torch.distributed, NCCL/RCCL, GPU buffers)
    mpirun   ... allreduce_perf.py --backend mpi  [--sizes 4096,...]      (mpi4py, no torch needed)

Per size: float32 buffer, a few warm-up calls, then ``iters`` timed in-place sums; the time of a
call is the slowest rank's mean. algbw = bytes / time; busbw = algbw * 2(n-1)/n (the factor that
makes a ring all-reduce's busbw comparable with the link's bandwidth). Rank 0 prints one line per
size: ``ALLREDUCE {"backend": ..., "bytes": ..., "time_s": ..., "algbw_gbs": ..., "busbw_gbs": ...}``
(GB = 1e9 bytes). A stand-alone script on purpose: the orchestrator runs it as a user script (`make netcheck`,
and the benchmarks' collectives section).
"""

from __future__ import annotations

import argparse
import json
import os
import time

DEFAULT_SIZES = [4096 * 4**k for k in range(9)]  # 4 KiB .. 256 MiB


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n (a ring moves 2(n-1)/n of the buffer per rank)."""
    return algbw * 2 * (ranks - 1) / ranks


def iterations(nbytes: int, budget_bytes: float) -> int:
    """How many timed calls for this size: about ``budget_bytes`` moved per size, 3..50 calls."""
    return max(3, min(50, int(budget_bytes // nbytes)))


class TorchDist:
    """torch.distributed with gloo (CPU buffers) or NCCL/RCCL (the local GPU's buffers; ROCm builds answer to
    "nccl" with RCCL: https://pytorch.org/docs/stable/distributed.html#backends)."""

    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.device = torch.device("cpu")
        if backend == "nccl":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def buffer(self, count: int):
        return self.torch.ones(count, dtype=self.torch.float32, device=self.device)

    def allreduce(self, buf) -> None:
        self.dist.all_reduce(buf)

    def barrier(self) -> None:
        self.sync()
        self.dist.barrier()

    def sync(self) -> None:
        """GPU collectives are queued on a stream: the clock stops only once they ran."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def max(self, value: float) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def close(self) -> None:
        self.dist.destroy_process_group()


class Mpi:
    def __init__(self) -> None:
        import numpy as np
        from mpi4py import MPI

        self.np, self.MPI, self.comm = np, MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def buffer(self, count: int):
        return self.np.ones(count, dtype=self.np.float32)

    def allreduce(self, buf) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def barrier(self) -> None:
        self.comm.Barrier()

    def sync(self) -> None:
        pass

    def max(self, value: float) -> float:
        return self.comm.allreduce(value, op=self.MPI.MAX)

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), required=True)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="bytes, comma-separated")
    parser.add_argument("--budget-mb", type=float, default=1024, help="about this many MB moved per size")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    comm = Mpi() if args.backend == "mpi" else TorchDist(args.backend)
    n = comm.size
    for nbytes in (int(s) for s in args.sizes.split(",")):
        buf = comm.buffer(max(1, nbytes // 4))
        for _ in range(args.warmup):
            comm.allreduce(buf)
        iters = iterations(nbytes, args.budget_mb * 1e6)
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            comm.allreduce(buf)
        comm.sync()
        elapsed = comm.max((time.perf_counter() - start) / iters)
        if comm.rank == 0:
            algbw = nbytes / elapsed / 1e9
            row = {"backend": args.backend, "ranks": n, "bytes": nbytes, "iters": iters, "time_s": elapsed,
                   "algbw_gbs": algbw, "busbw_gbs": bus_bandwidth(algbw, n)}
            print("ALLREDUCE " + json.dumps(row), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
