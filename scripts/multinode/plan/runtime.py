"""Runtimes: how a planned node command becomes the shell line sent over SSH.

* ``host``: run in the node's own environment (the local provider: the project's venv).
* ``docker``: run inside the mode's image with ``docker run --network=host`` -- the host network,
  so rendezvous, gloo, NCCL and MPI see the node's real interfaces and addresses -- plus the
  accelerator's devices (``--gpus all`` for NVIDIA; ``/dev/kfd`` + ``/dev/dri`` and the ``video``
  group for AMD). The node's work directory is mounted at the same path, so plans don't change.
  The container CLI is ``docker`` unless the inventory says otherwise: ``extra["container_cli"]`` is
  a command line, so it may carry global options (our local tests: ``podman --root DIR
  --storage-driver overlay --runtime runc``); ``extra["container_args"]`` are added to every ``run``.

MODE=mpi: mpirun runs in the head's container and starts the other ranks over SSH. For those ranks
to run in the image too, every other node runs the image's own sshd (port 2222, see docker/sshd_config)
in a container of the run (:func:`mpi_sshd_shell`), with the node's pinned host key and the cluster's
authorized key mounted; :meth:`ContainerRuntime.stop_line` removes it with the run. The paths come from
``extra["container_sshd"]`` (``host_key`` may hold ``{node}``); defaults suit a cloud node.

Ownership: a job container runs as the node's SSH user (``--user "$(id -u):$(id -g)"``, read by the node's
shell), never as the image's root, so everything a job writes into the mounted work directory -- Python's
``__pycache__``, snapshots, the SETUP environment -- belongs to that user and the next sync or ``rm -rf`` of
the user works (a root-owned ``__pycache__`` made a second ``make train`` fail; issue 27). ``HOME`` is the
node's ``<workdir>/home`` (pip's, torch hub's and Triton's caches persist per node there); ``USER`` and
``LOGNAME`` are the SSH user's name, so ``getpass.getuser()`` (torch inductor's cache path) works without a
passwd entry. The image's entrypoint adds that entry where the engine does not (Docker does not, podman does:
``ssh`` -- mpirun's remote launch -- refuses a uid without one; docker/entrypoint.sh). The MPI sshd container
alone starts as root (it reads the node's host key and logs the user in): its entrypoint adds the SSH user to
the container's passwd so mpirun's sessions, and the ranks they start, run as that user too.

Node-evaluated environment (``NodeCommand.node_env``) is computed on the host shell first and
passed into the container by name, so ``ip`` need not exist in the image; ENV values are sourced
from the node's env file by the host shell and passed the same way, never on the command line.
"""

from __future__ import annotations

import shlex
from multinode.core.registry import Registry
from multinode.core.inventory import Inventory
from multinode.plan.launchers.base import NodeCommand

# GPU nodes also lift the locked-memory limit: NCCL/RCCL and UCX pin host buffers for GPU copies.
# CPU nodes keep the engine's default (raising it needs CAP_SYS_RESOURCE, which a sandbox may lack).
UNLIMITED_MEMLOCK = ("--ulimit", "memlock=-1")
ACCELERATOR_FLAGS = {
    "none": (),
    "nvidia": ("--gpus", "all", *UNLIMITED_MEMLOCK),
    # ROCm needs the kernel driver (kfd), the render nodes (dri) and the video group.
    "amd": ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--security-opt", "seccomp=unconfined",
            *UNLIMITED_MEMLOCK),
}


# Open MPI's shared-memory BTL (vader) copies large messages with process_vm_readv (CMA), which needs ptrace
# access to the peer rank; a container may be refused it (Docker without CAP_SYS_PTRACE: open-mpi/ompi issue
# 4948, where every rank prints "Read -1, expected <n>, errno = 1"; --cap-add gives a non-root user nothing).
# The workaround given there is this MCA parameter: large messages then go through shared-memory FIFOs
# (copy-in/copy-out). Set in every container of the run; mpirun passes OMPI_MCA_* of its environment on to
# the orteds it starts (seen on an orted's command line in a container MPI run here, 2026-11-24).
CONTAINER_ENV = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
# The node's SSH user, read by the node's shell where the line runs (kept out of shlex: that shell expands it).
# USER/LOGNAME by value, not passed through: a CLI run through sudo (our local tests) would pass sudo's root.
RUN_AS_USER = '--user "$(id -u):$(id -g)" -e USER="$(id -un)" -e LOGNAME="$(id -un)"'
# The MPI sshd container starts as root and learns whom to let in from these (docker/entrypoint.sh).
SSHD_USER = '-e MULTINODE_USER="$(id -un)" -e MULTINODE_UID="$(id -u)" -e MULTINODE_GID="$(id -g)"'
# AMD: /dev/kfd belongs to the host's `render` group (Ubuntu >= 20.04), whose gid the image cannot know;
# root ignored that, the SSH user needs the number (ROCm/ROCm-docker issues 90 and 116).
AMD_RENDER_GROUP = '--group-add "$(stat -c %g /dev/kfd)"'


def node_home(inventory: Inventory, node: str) -> str:
    """HOME inside the node's containers: in the mounted work directory, the SSH user's."""
    return f"{inventory.workdir_for(node)}/home"


# Where the image's sshd (MODE=mpi) finds the node's host key and the authorized keys on the node.
CONTAINER_SSHD_DEFAULTS = {"host_key": "/etc/ssh/ssh_host_ed25519_key", "authorized_keys": "$HOME/.ssh/authorized_keys"}


def container_name(run_id: str, node: str) -> str:
    return f"mn-{run_id}-{node}"


def sshd_container_name(run_id: str, node: str) -> str:
    return f"mn-{run_id}-{node}-sshd"


def container_cli(inventory: Inventory) -> list[str]:
    """The container CLI as argv: ``docker``, or e.g. ``podman --root DIR --runtime runc``."""
    return shlex.split(inventory.extra.get("container_cli", "docker"))


class Runtime:
    """How commands run on the nodes of one inventory for one run: the host's own environment. Bound once to
    (inventory, run id); the run asks it and never branches on the runtime's name."""

    name = "host"
    compares_software = True  # every node has its own software: the skew check compares the nodes
    mpi_peers_are_nodes = True  # mpirun reaches the other nodes' own sshd (checked at pre-flight)

    def __init__(self, inventory: Inventory, run_id: str):
        self.inventory, self.run_id = inventory, run_id

    def wrap(self, command: NodeCommand) -> str:
        """The exact line to run on ``command.node``."""
        return command.shell()

    def checks(self) -> list[tuple[str, str]]:
        """Pre-flight shell checks: (description, command that exits 0 when fine). GPUs are checked after these,
        by the smoke test inside the runtime (:mod:`multinode.checks.gpu`)."""
        py = shlex.quote(self.inventory.python)
        # The interpreter only, in the shell: whether it has torch (and which) is the software probe's answer
        # (multinode.checks.software, one Python run per node and job; a second one here cost 0.4 s at 32 nodes).
        return [("python", f"command -v {py} >/dev/null || {{ echo 'no such interpreter: '{py}; false; }}")]

    def stop_line(self, node: str) -> str | None:
        """What else stops with the run on ``node`` (beyond its tagged processes); None: nothing."""
        return None

    def image(self) -> str | None:
        """The image every rank runs in (None: the node's own environment)."""
        return None


class ContainerRuntime(Runtime):
    """Every command inside the mode's image (``docker run --network=host``, see the module doc)."""

    name = "docker"
    compares_software = False  # every node runs the one image
    mpi_peers_are_nodes = False  # mpirun's peers are sshds the run starts in containers (start_mpi_sshds)

    def wrap(self, command: NodeCommand) -> str:
        inv, node = self.inventory, self.inventory.node(command.node)
        workdir = inv.workdir_for(node.name)
        argv = [
            *container_cli(inv), "run", "--rm",
            "--name", container_name(self.run_id, node.name),
            "--network=host",
            # Data-loader workers and NCCL use /dev/shm; Docker's 64 MiB default breaks both.
            "--ipc=host",
            "-v", f"{workdir}:{workdir}",
            "-w", command.cwd,
            "-e", "MULTINODE_RUN_ID",
            "-e", f"HOME={node_home(inv, node.name)}",
        ]
        argv += inv.extra.get("container_args", [])
        for key, value in CONTAINER_ENV.items():
            argv += ["-e", f"{key}={value}"]
        for key, value in command.env.items():
            argv += ["-e", f"{key}={value}"]
        for key in (*command.node_env, *command.secret_env):  # by name: the values come from the host shell
            argv += ["-e", key]
        argv += ACCELERATOR_FLAGS[node.accelerator]
        user = RUN_AS_USER + (f" {AMD_RENDER_GROUP}" if node.accelerator == "amd" else "")
        exports = [f'export {k}="{expr}"' for k, expr in command.node_env.items()]
        home = shlex.quote(node_home(inv, node.name))
        return " && ".join([f"mkdir -p {shlex.quote(command.cwd)} {home}", *command.sourced(), *exports,
                            f"exec {shlex.join(argv)} {user} {shlex.join([inv.image or '', *command.argv])}"])

    def checks(self) -> list[tuple[str, str]]:
        cli = container_cli(self.inventory)
        inspect = f"{shlex.join(cli)} image inspect {shlex.quote(self.inventory.image or '')} >/dev/null"
        return [(f"{cli[0]} and image {self.inventory.image}", inspect)]

    def stop_line(self, node: str) -> str | None:
        """Remove the run's containers on ``node``."""
        cli = shlex.join(container_cli(self.inventory))
        # One name per call: podman 4.3's `rm -f missing present` removes neither and still exits 0.
        names = [container_name(self.run_id, node), sshd_container_name(self.run_id, node)]
        return "; ".join(f"{cli} rm -f {shlex.quote(name)} >/dev/null 2>&1" for name in names) + "; true"

    def image(self) -> str | None:
        return self.inventory.image


def mpi_sshd_shell(inventory: Inventory, node: str, run_id: str) -> str:
    """The line that starts the image's sshd on ``node`` in the background (container runtime, MODE=mpi).
    It runs as root (the node's host key is root's); its entrypoint adds the node's SSH user, named by
    ``MULTINODE_USER``/``_UID``/``_GID``, read by the node's shell, whom mpirun then logs in as."""
    paths = {**CONTAINER_SSHD_DEFAULTS, **inventory.extra.get("container_sshd", {})}
    workdir = inventory.workdir_for(node)
    argv = [
        *container_cli(inventory), "run", "-d", "--rm",
        "--name", sshd_container_name(run_id, node),
        "--network=host", "--ipc=host",
        "-v", f"{workdir}:{workdir}",
        "-v", f"{paths['host_key'].format(node=node)}:/etc/multinode/ssh_host_ed25519_key:ro",
        "-e", f"HOME={node_home(inventory, node)}",
        *[arg for key, value in CONTAINER_ENV.items() for arg in ("-e", f"{key}={value}")],
        *inventory.extra.get("container_args", []),
        *ACCELERATOR_FLAGS[inventory.node(node).accelerator],
        inventory.image or "",
    ]
    # Double quotes, not shlex: the node's shell expands $HOME in the default authorized_keys path.
    keys = f'-v "{paths["authorized_keys"]}:/etc/multinode/authorized_keys:ro"'
    return (f"mkdir -p {shlex.quote(node_home(inventory, node))} && "
            f"{shlex.join(argv[:-1])} {keys} {SSHD_USER} {shlex.quote(argv[-1])} >/dev/null")


RUNTIMES = Registry("runtime", "runtimes", {"host": f"{__name__}:Runtime", "docker": f"{__name__}:ContainerRuntime"})


def runtime_for(inventory: Inventory, run_id: str = "") -> Runtime:
    """The inventory's runtime, bound to it and to ``run_id`` (none: the cluster's, outside any run -- its image,
    its checks)."""
    return RUNTIMES.create(inventory.runtime, inventory, run_id)


def to_shell(command: NodeCommand, inventory: Inventory, run_id: str) -> str:
    """The exact line to run on ``command.node`` for this inventory's runtime."""
    return runtime_for(inventory, run_id).wrap(command)
