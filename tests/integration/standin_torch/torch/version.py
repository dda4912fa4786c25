# Read as text by multinode.checks.software (the first assignment of each name), imported by the smoke check.
__version__ = '2.13.0'
cuda = '13.0'
hip = None
from torch._standin import CONFIG as _CONFIG  # noqa: E402

__version__, cuda, hip = _CONFIG["torch"], _CONFIG.get("cuda"), _CONFIG.get("hip")
