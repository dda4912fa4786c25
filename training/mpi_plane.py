"""MPI as the gradient data plane: gradients averaged with mpi4py ``Allreduce`` on flat buckets.

Used under mpirun when torch has no MPI backend (stock wheels). Gradients are reduced in a few flat
float32 buckets (~25 MB each) that live as long as the model: reducing autograd's own, freshly
allocated gradient tensors in place instead measured 9 ms per step against 4 ms (the 5,267,466-parameter benchmark MLP).
Each gradient lands in its bucket once, as autograd finishes it (a post-accumulate hook copies it
there and makes the bucket's view the parameter's ``.grad``), so the step needs no memset of the
buckets and no accumulate-into-buffer pass; a second micro-batch accumulates into the view directly.
After ``backward()`` each bucket is summed in place with one ``MPI.Allreduce``. The loss is divided
by the world size before backward (:meth:`MpiGradients.prescale`, like DeepSpeed's
``prescale_gradients``), so the sum is already the average: no pass over the buckets afterwards.
On a CPU each such pass costs as much memory traffic as the reduction itself.
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
        self.comm_seconds = 0.0
        # Buckets of up to BUCKET_BYTES in parameter order; each parameter gets its view of one, filled by
        # a post-accumulate hook as backward finishes its gradient.
        groups: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in self.params:
            if size and size + p.numel() * 4 > BUCKET_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += p.numel() * 4
        self.flat: list[torch.Tensor] = []
        self.views: list[tuple[nn.Parameter, torch.Tensor]] = []
        for group in groups:
            flat = torch.zeros(sum(p.numel() for p in group), dtype=torch.float32, device=group[0].device)
            offset = 0
            for p in group:
                view = flat[offset:offset + p.numel()].view_as(p)
                p.register_post_accumulate_grad_hook(self._into_bucket(view))
                self.views.append((p, view))
                offset += p.numel()
            self.flat.append(flat)

    def broadcast_parameters(self) -> None:
        """Every rank starts from rank 0's weights (as DDP does at construction)."""
        with torch.no_grad():
            for p in self.params:
                host = p.detach().cpu().contiguous()
                self.comm.Bcast(host.numpy(), root=0)
                p.copy_(host.to(p.device))

    @staticmethod
    def _into_bucket(view: torch.Tensor):
        def hook(p: torch.Tensor) -> None:
            if p.grad is not view:  # first micro-batch since zero_grad(set_to_none=True): autograd's tensor
                view.copy_(p.grad)
                p.grad = view
        return hook

    def prescale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to run backward on: divided by the world size, so :meth:`average`'s sum is the mean."""
        return loss / self.world

    def average(self) -> None:
        """Average every gradient across ranks: sum the prescaled gradients (after backward, before
        optimizer.step). A parameter that got no gradient this step (unused on this rank) still has its
        bucket slot, zeroed, so every rank reduces the same buffers."""
        from mpi4py import MPI

        for p, view in self.views:
            if p.grad is None:  # no gradient reached it this step: contribute zeros, still take the sum
                view.zero_()
                p.grad = view
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
