"""MPI as the gradient data plane: gradients averaged with mpi4py ``Allreduce`` on flat buckets.

Used under mpirun when torch has no MPI backend (stock wheels). Every gradient is a view into one of
a few flat float32 buckets (~25 MB each, like DDP's ``gradient_as_bucket_view``), so after
``backward()`` each bucket is summed in place with one ``MPI.Allreduce`` and divided by the world
size, with no packing or unpacking copies.
GPU tensors go through host memory unless the MPI library is CUDA/ROCm-aware (then the device
buffer is passed directly); :attr:`MpiGradients.kind` says which ran.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

import torch
from torch import nn

BUCKET_BYTES = 25 * 1024 * 1024


def loaded_mpi_library() -> str | None:
    """Path of the MPI library mpi4py loaded into this process (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("mpi")


def gpu_aware(library: str | None, rocm: bool) -> bool:
    """Does this MPI accept device pointers? Asked through its MPIX extension (Open MPI's
    ``MPIX_Query_cuda_support`` / ``MPIX_Query_rocm_support``); False when the library cannot say."""
    if library is None:
        return False
    try:
        query = getattr(ctypes.CDLL(library), "MPIX_Query_rocm_support" if rocm else "MPIX_Query_cuda_support")
    except (OSError, AttributeError):
        return False
    query.restype = ctypes.c_int
    return bool(query())


class MpiGradients:
    def __init__(self, model: nn.Module, comm, device: torch.device):
        self.comm = comm
        self.world = comm.Get_size()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.direct = device.type == "cpu" or gpu_aware(loaded_mpi_library(), rocm=torch.version.hip is not None)
        aware = "rocm-aware" if torch.version.hip else "cuda-aware"
        self.kind = "mpi4py-allreduce(host)" if device.type == "cpu" else (
            f"mpi4py-allreduce({aware})" if self.direct else "mpi4py-allreduce(host-staged)")
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in self.params:
            if size and size + p.numel() * 4 > BUCKET_BYTES:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * 4
        self.comm_seconds = 0.0

    def broadcast_parameters(self) -> None:
        """Every rank starts from rank 0's weights (as DDP does at construction)."""
        with torch.no_grad():
            for p in self.params:
                host = p.detach().cpu().contiguous()
                self.comm.Bcast(host.numpy(), root=0)
                p.copy_(host.to(p.device))

    def attach_buckets(self) -> None:
        """Make every gradient a view into a flat per-bucket buffer (like DDP's gradient_as_bucket_view):
        backward accumulates straight into the buffers, so no copy is needed around the allreduce."""
        self.flat = []
        for bucket in self.buckets:
            device = bucket[0].device
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=torch.float32, device=device)
            offset = 0
            for p in bucket:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flat.append(flat)

    def average(self) -> None:
        """Average every gradient across ranks (call after backward, before optimizer.step)."""
        from mpi4py import MPI

        if not hasattr(self, "flat"):
            raise RuntimeError("MpiGradients.attach_buckets() must run before the first backward")
        for flat in self.flat:
            start = time.perf_counter()
            if flat.is_cuda and self.direct:
                # MPI reads the device memory directly: backward's kernels must have finished.
                torch.cuda.current_stream(flat.device).synchronize()
                raw = [MPI.buffer.fromaddress(flat.data_ptr(), flat.numel() * flat.element_size()), MPI.FLOAT]
                self.comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
            elif flat.is_cuda:
                host = flat.cpu()  # synchronous copy: waits for backward
                self.comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
                flat.copy_(host)
            else:
                self.comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
            self.comm_seconds += time.perf_counter() - start
            flat.div_(self.world)
