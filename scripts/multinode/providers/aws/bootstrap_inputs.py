"""What the node bootstrap (infra/ec2/user_data.sh.tftpl) needs from the rest of the repository, read as data.

* the host runtime's Python packages: ``docker/requirements.txt``, the images' own pinned list, so a cluster
  without an image runs the same versions as one with;
* the GPU smoke test: the source of ``SMOKE_SCRIPT`` in ``multinode/checks/gpu.py``, the very check ``make
  train`` runs before a job, so an image or a torch build without kernels for the node's GPU fails ``up``.

The smoke test is read from the file's syntax tree, not imported: ``multinode.checks`` sits above the
providers in the import layers (pyproject.toml), and the provider needs only the text. Either file missing
or changed shape is a :class:`~multinode.core.errors.UserError` naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from multinode.core.config import ClusterSpec
from multinode.core.errors import UserError
from multinode.core.resources import docker_dir, package_dir
from multinode.providers.aws.settings import AwsSettings


def requirements_path() -> Path:
    """``docker/requirements.txt``, where it ships (:mod:`multinode.core.resources`)."""
    return docker_dir() / "requirements.txt"


def gpu_check_path() -> Path:
    """``multinode/checks/gpu.py`` of the package Python imported (installed or the checkout's)."""
    return package_dir() / "checks" / "gpu.py"


def host_requirements(path: Path | None = None) -> list[str]:
    """The pinned requirement lines of ``path`` (default: :func:`requirements_path`; comments and blank lines
    dropped)."""
    path = path or requirements_path()
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise UserError(f"cannot read {path} (the host runtime's package list): {err.strerror}") from None
    found = [line.split("#", 1)[0].strip() for line in lines]
    return [line for line in found if line]


def gpu_smoke_script(path: Path | None = None) -> str:
    """The string assigned to ``SMOKE_SCRIPT`` at the top level of ``path`` (default: :func:`gpu_check_path`)."""
    path = path or gpu_check_path()
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError) as err:
        raise UserError(f"cannot read the GPU smoke test from {path}: {err}") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SMOKE_SCRIPT" for t in node.targets):
            value = ast.literal_eval(node.value)
            if isinstance(value, str) and value.strip():
                return value
    raise UserError(f"{path} has no SMOKE_SCRIPT string at its top level; the bootstrap's GPU check needs it")


def bootstrap_tfvars(spec: ClusterSpec, settings: AwsSettings) -> dict[str, Any]:
    """The bootstrap's inputs: the image (none: the host runtime and its packages) and, on GPU nodes, the
    GPU smoke test that ends the bootstrap."""
    tfvars: dict[str, Any] = {"image": settings.image} if settings.image else {"host_requirements": host_requirements()}
    if spec.cluster_type != "cpu":
        tfvars["gpu_smoke_script"] = gpu_smoke_script()
    return tfvars
