"""Where the files that ship with multinode lie: the Terraform module and prices (``infra/``), the image build
contexts and the host runtime's package list (``docker/``), and our trainer (``training/``).

One resolver for both ways multinode runs:

* installed (a wheel, ``pip install``): the three trees are package data inside the package, as
  ``multinode/infra``, ``multinode/docker`` and ``multinode/trainer`` (pyproject.toml maps the repository's
  ``infra/``, ``docker/`` and ``training/`` there; the trainer is importable as ``multinode.trainer``, never as
  a top-level ``training`` that a user's own package could collide with);
* a checkout (``PYTHONPATH=scripts``, or an editable install): the package is ``scripts/multinode`` and the
  trees are where the repository keeps them, at its top level.

The package's own place comes from :func:`importlib.resources.files` (the installed copy, or the checkout's
``scripts/multinode``, whichever Python imported); the installed name is looked for first, then the checkout's.
A tree found in neither is one :class:`UserError` line naming both places and the fix.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from multinode.core.errors import UserError

# name inside the installed package -> the repository's top-level directory that pyproject.toml maps to it
BUNDLED = {"infra": "infra", "docker": "docker", "trainer": "training"}


def package_dir() -> Path:
    """The directory of the ``multinode`` package Python imported (installed, or the checkout's scripts/multinode)."""
    return Path(str(files("multinode")))


def bundled(name: str) -> Path:
    """The directory of the shipped tree ``name`` (a key of :data:`BUNDLED`): installed first, then the checkout's."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled tree {name!r}; valid: {', '.join(BUNDLED)}")
    package = package_dir()
    candidates = (package / name, package.parent.parent / BUNDLED[name])
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise UserError(f"multinode's {BUNDLED[name]}/ files are missing (looked in {candidates[0]} and "
                    f"{candidates[1]}); reinstall multinode (pip install --force-reinstall multinode)")


def infra_dir() -> Path:
    """``infra/``: the Terraform module ``ec2/`` and ``prices.json``."""
    return bundled("infra")


def docker_dir() -> Path:
    """``docker/``: the image build contexts and ``requirements.txt`` (the host runtime's packages)."""
    return bundled("docker")


def trainer_dir() -> Path:
    """``training/``: our trainer, synced to every node as ``code/training``."""
    return bundled("trainer")
