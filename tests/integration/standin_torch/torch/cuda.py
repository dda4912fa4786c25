"""torch.cuda of the stand-in: the devices MULTINODE_STANDIN_GPU describes (torch.cuda is HIP's on ROCm builds)."""

from collections import namedtuple

from torch._standin import CONFIG, check_device

# The fields the smoke check reads of torch.cuda.get_device_properties (torch/csrc/cuda/Module.cpp
# registers name, major, minor, gcnArchName, total_memory, ...).
_DeviceProperties = namedtuple("_CudaDeviceProperties", "name major minor gcnArchName total_memory multi_processor_count")


def is_available() -> bool:
    return CONFIG["count"] > 0


def device_count() -> int:
    return CONFIG["count"]


def get_arch_list() -> list[str]:
    """The architectures the build has kernels for (empty when no GPU is visible, as torch returns)."""
    return list(CONFIG["built"]) if is_available() else []


def get_device_properties(index: int = 0) -> _DeviceProperties:
    check_device(index)
    arch = CONFIG["arch"]
    if CONFIG.get("hip"):
        # ROCm reports a CUDA-style capability derived from the gfx version and the full arch in gcnArchName.
        return _DeviceProperties(CONFIG["name"], 10, 1, arch, 8 << 30, 36)
    major, minor = int(arch[3:-1]), int(arch[-1])
    return _DeviceProperties(CONFIG["name"], major, minor, "", 16 << 30, 40)


def get_device_name(index: int = 0) -> str:
    return get_device_properties(index).name


def get_device_capability(index: int = 0) -> tuple[int, int]:
    props = get_device_properties(index)
    return props.major, props.minor


def synchronize(device=None) -> None:
    return None
