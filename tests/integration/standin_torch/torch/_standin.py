"""The stand-in's devices and tensors, and errors written after those real builds give when a GPU has no kernels.

``MULTINODE_STANDIN_GPU`` (JSON, or the path of a JSON file) describes the node:

* ``torch``, ``cuda`` / ``hip``: ``torch.__version__`` and ``torch.version.cuda`` / ``.hip`` of the build;
* ``count``, ``name``, ``arch``: the GPUs (``sm_75`` for a T4, ``gfx1011`` for a V520); count 0: none visible;
* ``built``: the architectures torch's own kernels were compiled for (``torch.cuda.get_arch_list()``);
* ``blas``: the architectures rocBLAS has Tensile libraries for (default: the device's);
* ``wrong``: the GPU computes wrong numbers (a broken card).

What fails where, as in the real builds:

* A GEMM on ROCm without rocBLAS kernels for the arch: rocBLAS prints its message and aborts the process
  (``rocblas_abort_once`` -> SIGABRT, exit 134: the stack in ROCm/rocBLAS issue 1339) -- no Python exception.
  Text as in ROCm/ROCm issue 4625 (rocBLAS of ROCm 6.4.0 on gfx906): "rocBLAS error: Cannot read
  /opt/rocm-6.4.0/lib/rocblas/library/TensileLibrary.dat: No such file or directory for GPU arch : gfx906",
  then " List of available TensileLibrary Files : " and one quoted ``TensileLibrary_lazy_<arch>.dat`` per line.
  cuBLAS (the ``nvidia-cublas`` wheel) carries kernels for every architecture the CUDA release supports: no case.
* torch's own kernel (here the fill of ``torch.ones``) on an arch it was not built for: a
  ``torch.AcceleratorError`` (a RuntimeError) from ``C10_CUDA_CHECK`` (c10/cuda/CUDAException.cpp), whose
  text is "CUDA error: " + cudaGetErrorString(cudaErrorNoKernelImageForDevice) = "no kernel image is available
  for execution on the device", or on ROCm "HIP error: invalid device function" (hipErrorInvalidDeviceFunction),
  each followed by torch's suffix lines (seen verbatim in public logs: ComfyUI and KernelBench reports).
"""

from __future__ import annotations

import json
import math
import os
import sys

_SPEC = os.environ.get("MULTINODE_STANDIN_GPU", "{}")
CONFIG = {"torch": "2.13.0", "cuda": "13.0", "hip": None, "count": 0, "name": "", "arch": "", "built": [],
          **json.loads(open(_SPEC).read() if _SPEC.startswith("/") else _SPEC)}

float32 = "float32"

CUDA_SUFFIX = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
               "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
               "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
HIP_SUFFIX = ("\nHIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
              "might be incorrect.\nFor debugging consider passing AMD_SERIALIZE_KERNEL=3\n"
              "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.\n")
NO_KERNEL_CUDA = ("CUDA error: no kernel image is available for execution on the device\nSearch for "
                  "`cudaErrorNoKernelImageForDevice' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
                  "group__CUDART__TYPES.html for more information." + CUDA_SUFFIX)
NO_KERNEL_HIP = ("HIP error: invalid device function\nSearch for `hipErrorInvalidDeviceFunction' in "
                 "https://rocm.docs.amd.com/projects/HIP/en/latest/index.html for more information." + HIP_SUFFIX)
ROCBLAS_LIBRARY = "/opt/venv/lib/python3.12/site-packages/torch/lib/rocblas/library"


class AcceleratorError(RuntimeError):
    """torch.AcceleratorError: what C10_CUDA_CHECK raises (a RuntimeError, as before torch 2.8)."""


class device:
    def __init__(self, kind: str, index: int = 0):
        self.type, self.index = kind, index

    def __repr__(self) -> str:
        return f"device(type='{self.type}', index={self.index})"


def check_device(index: int) -> None:
    if not 0 <= index < CONFIG["count"]:
        raise AcceleratorError(("HIP" if CONFIG.get("hip") else "CUDA") + " error: invalid device ordinal")


def _no_torch_kernels() -> None:
    if CONFIG["arch"] not in CONFIG["built"]:
        raise AcceleratorError(NO_KERNEL_HIP if CONFIG.get("hip") else NO_KERNEL_CUDA)


def _gemm() -> None:
    """rocBLAS picking its Tensile library for the device (cuBLAS has kernels for every arch: nothing to fail)."""
    blas = CONFIG.get("blas", [CONFIG["arch"]])
    if not CONFIG.get("hip") or CONFIG["arch"] in blas:
        return
    sys.stderr.write(f"\nrocBLAS error: Cannot read {ROCBLAS_LIBRARY}/TensileLibrary.dat: No such file or directory "
                     f"for GPU arch : {CONFIG['arch']}\n List of available TensileLibrary Files : \n")
    for arch in blas:
        sys.stderr.write(f'"{ROCBLAS_LIBRARY}/TensileLibrary_lazy_{arch}.dat"\n')
    sys.stderr.flush()
    os.abort()


class Tensor:
    """A dense float tensor on ``cpu`` or ``cuda:i``: values in a flat list, row-major."""

    def __init__(self, values: list[float], shape: tuple[int, ...], where: str = "cpu"):
        self.values, self.shape, self.where = values, shape, where

    def reshape(self, *shape: int) -> Tensor:
        return Tensor(self.values, tuple(shape), self.where)

    def __mod__(self, k: float) -> Tensor:
        self._kernel()
        return Tensor([math.fmod(v, k) for v in self.values], self.shape, self.where)

    def __sub__(self, other: Tensor) -> Tensor:
        self._kernel()
        return Tensor([a - b for a, b in zip(self.values, other.values)], self.shape, self.where)

    def abs(self) -> Tensor:
        self._kernel()
        return Tensor([abs(v) for v in self.values], self.shape, self.where)

    def max(self) -> Tensor:
        return Tensor([max(self.values)], (), self.where)

    def sum(self) -> Tensor:
        self._kernel()
        total = math.fsum(self.values) + (1.0 if self._wrong() else 0.0)
        return Tensor([total], (), self.where)

    def item(self) -> float:
        return self.values[0]

    def to(self, dev) -> Tensor:
        """A copy between host and device: no kernel, works on any GPU."""
        where = dev if isinstance(dev, str) else f"{dev.type}:{dev.index}" if dev.type == "cuda" else "cpu"
        if where.startswith("cuda"):
            check_device(int(where.partition(":")[2] or 0))
        return Tensor(list(self.values), self.shape, where)

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def __matmul__(self, other: Tensor) -> Tensor:
        if self.where != "cpu":
            _gemm()
        n, k = self.shape
        m = other.shape[1]
        a, b = self.values, other.values
        out = [math.fsum(a[i * k + j] * b[j * m + c] for j in range(k)) for i in range(n) for c in range(m)]
        if self._wrong():
            out[0] += 3.0
        return Tensor(out, (n, m), self.where)

    def _kernel(self) -> None:
        if self.where != "cpu":
            _no_torch_kernels()

    def _wrong(self) -> bool:
        return self.where != "cpu" and bool(CONFIG.get("wrong"))


def arange(n: int, dtype=None) -> Tensor:
    return Tensor([float(i) for i in range(n)], (n,))


def ones(n: int, device=None) -> Tensor:
    """torch.ones on a GPU runs torch's fill kernel."""
    t = Tensor([1.0] * n, (n,))
    if device is None:
        return t
    t = t.to(device)
    t._kernel()
    return t


def equal(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.values == b.values
