"""A stand-in for a CUDA or ROCm build of torch on a GPU node: only what the GPU smoke check calls (see README.md)."""

from torch import cuda, version
from torch._standin import AcceleratorError, Tensor, arange, device, equal, float32, ones

__version__ = version.__version__
__all__ = ["AcceleratorError", "Tensor", "arange", "cuda", "device", "equal", "float32", "ones", "version"]
