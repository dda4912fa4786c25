"""Runtimes: how a planned node command becomes the shell line sent over SSH.

* ``host``: run in the node's own environment (the local provider: the project's venv).
* ``docker``: run inside the mode's image with ``docker run --network=host`` -- the host network,
  so rendezvous, gloo, NCCL and MPI see the node's real interfaces and addresses -- plus the
  accelerator's devices (``--gpus all`` for NVIDIA; ``/dev/kfd`` + ``/dev/dri`` and the ``video``
  group for AMD). The node's work directory is mounted at the same path, so plans don't change.
  The container CLI is ``docker`` unless the inventory says otherwise (podman in our local tests).

Node-evaluated environment (``NodeCommand.node_env``) is computed on the host shell first and
passed into the container by name, so ``ip`` need not exist in the image.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from multinode.errors import UserError
from multinode.inventory import Inventory, Node
from multinode.launchers.base import NodeCommand

ACCELERATOR_FLAGS = {
    "none": (),
    "nvidia": ("--gpus", "all"),
    # ROCm needs the kernel driver (kfd), the render nodes (dri) and the video group.
    "amd": ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--security-opt", "seccomp=unconfined"),
}


def container_name(run_id: str, node: str) -> str:
    return f"mn-{run_id}-{node}"


def host_shell(command: NodeCommand, inventory: Inventory, node: Node, run_id: str) -> str:
    return command.shell()


def docker_shell(command: NodeCommand, inventory: Inventory, node: Node, run_id: str) -> str:
    cli = inventory.extra.get("container_cli", "docker")
    workdir = inventory.workdir_for(node.name)
    argv = [
        cli, "run", "--rm",
        "--name", container_name(run_id, node.name),
        "--network=host",
        # Data-loader workers and NCCL use /dev/shm; Docker's 64 MiB default breaks both.
        "--ipc=host",
        "--ulimit", "memlock=-1",
        "-v", f"{workdir}:{workdir}",
        "-w", command.cwd,
        "-e", "MULTINODE_RUN_ID",
    ]
    argv += inventory.extra.get("container_args", [])
    for key, value in command.env.items():
        argv += ["-e", f"{key}={value}"]
    for key in command.node_env:
        argv += ["-e", key]
    argv += ACCELERATOR_FLAGS[node.accelerator]
    argv.append(inventory.image or "")
    argv += command.argv
    exports = [f'export {k}="{expr}"' for k, expr in command.node_env.items()]
    return " && ".join([f"mkdir -p {shlex.quote(command.cwd)}", *exports, "exec " + shlex.join(argv)])


RUNTIMES: dict[str, Callable[[NodeCommand, Inventory, Node, str], str]] = {"host": host_shell, "docker": docker_shell}


def to_shell(command: NodeCommand, inventory: Inventory, run_id: str) -> str:
    """The exact line to run on ``command.node`` for this inventory's runtime."""
    try:
        render = RUNTIMES[inventory.runtime]
    except KeyError:
        raise UserError(f"unknown runtime {inventory.runtime!r}; valid runtimes: {', '.join(RUNTIMES)}") from None
    return render(command, inventory, inventory.node(command.node), run_id)


def stop_containers(inventory: Inventory, run_id: str, node: str) -> str | None:
    """Extra stop step for the docker runtime: remove the run's container (None for host)."""
    if inventory.runtime != "docker":
        return None
    cli = inventory.extra.get("container_cli", "docker")
    return f"{cli} rm -f {shlex.quote(container_name(run_id, node))} >/dev/null 2>&1 || true"


def runtime_checks(inventory: Inventory, need_gpu: bool) -> list[tuple[str, str]]:
    """Pre-flight shell checks for this runtime: (description, command that exits 0 when fine)."""
    if inventory.runtime == "docker":
        cli = inventory.extra.get("container_cli", "docker")
        checks = [(f"{cli} and image {inventory.image}", f"{cli} image inspect {shlex.quote(inventory.image or '')} >/dev/null")]
    else:
        py = shlex.quote(inventory.python)
        # Locate torch without importing it: an import costs 1-4 s per node on a small machine (most of
        # pre-flight), and a torch that is installed but broken fails the launch at once anyway.
        find = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
        checks = [("python with torch", f"{py} -c \"{find}\" 2>&1")]
    if need_gpu:
        checks.append(
            ("a GPU", "nvidia-smi -L >/dev/null 2>&1 || rocm-smi >/dev/null 2>&1 || test -e /dev/kfd")
        )
    return checks
