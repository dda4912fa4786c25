"""Wheelhouses for offline image builds: an image's pinned wheels, fetched once per machine.

``make image IMAGE=cpu|cuda`` runs ``python -m multinode.images.wheelhouse IMAGE CONTEXT CACHE`` and builds
from the directory it prints, with ``--build-arg OFFLINE=1`` (pip in the build reads nothing but
that directory's ``wheelhouse/``). The contract, in order:

1. :func:`plan_wheelhouse` (pure): from the image's Dockerfile (``ARG TORCH_VERSION``),
   ``requirements.txt`` and the image's :data:`SOURCES` entry, the exact ``pip download`` command,
   its environment, and a key over all of them (requirements, torch build, indexes, the image's
   Python and platform tags). Another pin, index or Python is another key, hence another folder.
2. :func:`fill` fetches ``CACHE/<image>-<key>/`` once, under a lock (a second build waits rather
   than downloading the same GBs twice); ``SHA256SUMS`` is written last and marks it complete.
   The CUDA image's wheels are ~2.7 GB from PyPI (torch 2.13.0 and the ``nvidia-*`` wheels).
3. :func:`assemble_context` makes a fresh build context next to it: the files of CONTEXT, and
   ``wheelhouse/`` holding hard links to the cached wheels (no copy) plus ``SHA256SUMS``. The
   Dockerfiles copy ``SHA256SUMS`` into a layer and check the wheels against it, so the engine's
   layer cache is keyed by the exact wheels even where it does not hash bind-mounted files
   (buildah 1.28 does not). The caller removes the context after the build.

The image's pip must never see this machine's local wheels where they are the wrong build: pip's
machine config here adds a find-links folder whose ``torch-2.13.0+cpu`` sorts above PyPI's
``2.13.0`` (the CUDA 13.0 build), so the CUDA source clears pip's configuration entirely.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from multinode.core.errors import MultinodeError, UserError

# pip's settings that choose where packages come from (PIP_CONFIG_FILE=os.devnull drops its files).
PIP_SOURCE_VARIABLES = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT")
SUMS = "SHA256SUMS"


@dataclass(frozen=True)
class WheelSource:
    """Where one image's pip finds its wheels, and for which interpreter and platform."""

    torch_local: str  # local version label of the torch build ("+cpu"), "" for PyPI's default build
    index_args: tuple[str, ...]
    machine_config: bool  # keep pip's configuration of this machine (its find-links, constraints)
    python: str = "3.11"  # the image's Python (Debian 12)
    glibc: tuple[int, int] = (2, 36)  # the image's glibc (Debian 12): the newest manylinux tag it runs

    def __post_init__(self):
        if not re.fullmatch(r"3\.\d+", self.python):
            raise ValueError(f"python={self.python!r} is not a CPython 3.x version")

    def platforms(self) -> list[str]:
        """Every manylinux tag a glibc of this version runs (pip does not expand them itself)."""
        major, minor = self.glibc
        return [*(f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)),
                "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


SOURCES: dict[str, WheelSource] = {
    # The CPU build (+cpu) from PyTorch's CPU index; here pip's machine config finds it on local disk.
    # --retries 1: where that index does not resolve (this machine), pip gives up on it per package
    # after one retry instead of five (2.5 min for the cpu wheels here).
    "cpu": WheelSource("+cpu", ("--extra-index-url", "https://download.pytorch.org/whl/cpu", "--retries", "1"),
                       machine_config=True),
    # PyPI's default Linux x86_64 torch 2.13.0 is the CUDA 13.0 build; it pulls the nvidia-* wheels
    # (CUDA runtime, cuBLAS, cuDNN 9.20, NCCL 2.29.7). Verified 2026-11-23 with
    # `env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null pip download --no-deps torch==2.13.0`:
    # torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl (527 MB), nvidia_nccl_cu13-2.29.7 among its deps.
    "cuda": WheelSource("", ("--index-url", "https://pypi.org/simple"), machine_config=False),
}


@dataclass(frozen=True)
class WheelhousePlan:
    image: str
    key: str
    requirements: tuple[str, ...]
    argv: tuple[str, ...]  # pip download ... without --dest
    env: dict[str, str]

    @property
    def folder(self) -> str:
        return f"{self.image}-{self.key}"


def _torch_version(dockerfile: str, image: str) -> str:
    found = re.findall(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    if len(set(found)) != 1:
        raise UserError(f"docker/{image}/Dockerfile must set one ARG TORCH_VERSION=<version>; found {found or 'none'}")
    return found[0]


def _requirements(text: str) -> list[str]:
    lines = (line.split("#")[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def plan_wheelhouse(image: str, dockerfile: str, requirements_txt: str, python_exe: str,
                    environ: dict[str, str]) -> WheelhousePlan:
    """What to download for ``image`` and the key of everything that decides it (no I/O)."""
    source = SOURCES.get(image)
    if source is None:
        raise UserError(f"IMAGE={image} has no offline wheelhouse (images with one: {', '.join(SOURCES)}); "
                        f"build it with WHEEL_CACHE= (pip then reads the index inside the build)")
    requirements = (f"torch=={_torch_version(dockerfile, image)}{source.torch_local}", *_requirements(requirements_txt))
    tags = ["--only-binary=:all:", "--implementation", "cp", "--python-version", source.python,
            "--abi", "cp" + source.python.replace(".", "")]
    for platform in source.platforms():
        tags += ["--platform", platform]
    argv = (python_exe, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            *source.index_args, *tags, *requirements)
    env = dict(environ)
    if not source.machine_config:
        for name in PIP_SOURCE_VARIABLES:
            env.pop(name, None)
        env["PIP_CONFIG_FILE"] = os.devnull
    key_text = "\n".join([image, repr(source), *requirements, *argv[3:]])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    return WheelhousePlan(image, key, requirements, argv, env)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fill(plan: WheelhousePlan, cache: Path) -> Path:
    """``cache/<image>-<key>/`` with every wheel of the plan and ``SHA256SUMS``; downloads only once."""
    cache.mkdir(parents=True, exist_ok=True)
    folder = cache / plan.folder
    with open(cache / f"{plan.folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / SUMS).exists():
            return folder
        print(f"wheelhouse: downloading {' '.join(plan.requirements)} into {folder} (once per machine)",
              file=sys.stderr, flush=True)
        partial = cache / f"{plan.folder}.partial"  # kept across failures: pip skips wheels it already has
        partial.mkdir(exist_ok=True)
        res = subprocess.run([*plan.argv, "--dest", str(partial)], env=plan.env, stdout=sys.stderr)
        if res.returncode != 0:
            raise MultinodeError(f"wheelhouse: pip download for IMAGE={plan.image} failed (exit {res.returncode}); "
                                 f"see pip's message above")
        wheels = sorted(partial.glob("*.whl"))
        (partial / SUMS).write_text("".join(f"{_sha256(w)}  {w.name}\n" for w in wheels))
        partial.rename(folder)
        return folder


def assemble_context(context: Path, wheels: Path, cache: Path) -> Path:
    """A fresh build context: CONTEXT's files, and ``wheelhouse/`` linked to the cached wheels."""
    target = Path(tempfile.mkdtemp(prefix="context-", dir=cache))
    shutil.copytree(context, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("wheelhouse"))
    house = target / "wheelhouse"
    house.mkdir()
    for wheel in [*wheels.glob("*.whl"), wheels / SUMS]:
        try:
            os.link(wheel, house / wheel.name)
        except OSError:  # another filesystem: copy
            shutil.copy2(wheel, house / wheel.name)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multinode.images.wheelhouse", description=__doc__.split("\n")[0])
    parser.add_argument("image")
    parser.add_argument("context", type=Path, help="the build context (docker/)")
    parser.add_argument("cache", type=Path, help="where wheelhouses are kept, one folder per key")
    args = parser.parse_args(argv)
    try:
        dockerfile = args.context / args.image / "Dockerfile"
        if not dockerfile.is_file():
            raise UserError(f"{dockerfile} does not exist; IMAGE must be a folder of the build context")
        plan = plan_wheelhouse(args.image, dockerfile.read_text(), (args.context / "requirements.txt").read_text(),
                               sys.executable, dict(os.environ))
        print(assemble_context(args.context, fill(plan, args.cache), args.cache))
    except MultinodeError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
