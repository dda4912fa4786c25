"""What a launcher produces: a :class:`LaunchPlan`, the exact argv and environment per node.

Launchers are pure: (inventory, launch spec, entry point) -> plan. No I/O, no network, so
``--dry-run`` is free and tests assert on plans without starting a process (the way DeepSpeed's
``test_multinode_runner.py`` asserts ``cmd[0] == 'mpirun'``).

A plan's environment comes in two kinds:

* ``env``: literal values, the same wherever the plan is shown or run;
* ``node_env``: shell expressions evaluated on the node right before the launch, for facts only
  the node knows -- e.g. the name of the interface that holds the cluster subnet, which is how we
  pin gloo/NCCL to the cluster network without hard-coding ``eth0`` or ``ens5``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from multinode.core.config import LaunchSpec
from multinode.core.envvars import MASK
from multinode.core.errors import EXIT_PREEMPTED
from multinode.core.inventory import Inventory, Node
from multinode.core.nodepaths import code_dir, data_dir, env_file, setup_env_dir
from multinode.plan.launchers.words import cat, shell_join
from multinode.trainer import channel

# The rank environment's contract is the job channel's (training/channel.py): GRACE as MULTINODE_GRACE (SIGTERM is
# then a notice: one coordinated checkpoint, exit 75, and the rank has that long before SIGKILL); where training.guard
# notes that its command ended preempted (torchrun's own exit code says nothing of it:
# multinode.plan.launchers.torchrun); the variable that marks the guard's own process.
GRACE_ENV, PREEMPT_MARK_ENV, GUARD_ENV = channel.GRACE_ENV, channel.PREEMPT_MARK_ENV, channel.GUARD_ENV


def iface_for_subnet(subnet: str) -> str:
    """Shell expression printing the name of the node's interface that carries ``subnet``."""
    return f"$(ip -o -4 addr show to {subnet} | awk 'NR==1{{print $2}}')"


@dataclass(frozen=True)
class EntryPoint:
    """The program every rank runs: a path relative to its directory, or a module (``python -m``)."""

    script: str  # e.g. "training/train.py", "pkg/train.py", or the module "pkg.train"
    args: tuple[str, ...] = ()
    ours: bool = True  # our trainer: the launcher may add --snapshot-dir/--metrics-dir/--timeout
    module: bool = False  # run as ``python -m script`` (torchrun: ``-m script``)
    subdir: str = ""  # the project (WORKDIR) under the node's code dir: the ranks' cwd and PYTHONPATH

    def program(self) -> tuple[str, ...]:
        """What follows the interpreter (or torchrun's options): ``-m mod`` or the script path."""
        return ("-m", self.script) if self.module else (self.script,)


@dataclass(frozen=True)
class NodeCommand:
    """What runs on one node."""

    node: str
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    node_env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # absolute path on the node -> content (hostfile, ...)
    env_file: str | None = None  # ENV: a 0600 file of export lines on the node, sourced before the launch
    secret_env: tuple[str, ...] = ()  # the names it sets (their values are never in a plan)
    nproc: int = 1  # processes this node runs

    def sourced(self) -> list[str]:
        return [f". {shlex.quote(self.env_file)}"] if self.env_file else []

    def shell(self) -> str:
        """One POSIX-sh line: cd, exports, exec. What the runner sends over SSH (before tagging)."""
        parts = [f"cd {shlex.quote(self.cwd)}", *self.sourced()]
        parts += [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()]
        parts += [f'export {k}="{expr}"' for k, expr in self.node_env.items()]
        parts.append("exec " + shell_join(self.argv))
        return " && ".join(parts)


@dataclass(frozen=True)
class LaunchPlan:
    """Per node, exactly what will run. ``participants`` are stopped together when one fails."""

    run_id: str
    launcher: str
    commands: tuple[NodeCommand, ...]
    participants: tuple[str, ...]
    world_size: int
    procs: tuple[int, ...] = ()  # processes per participant (NPROC, or NPROC=auto's count per node)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def describe(self) -> str:
        """Human-readable dry-run output."""
        lines = [f"run {self.run_id}: {self.launcher}, world size {self.world_size}, nodes {', '.join(self.participants)}"]
        if self.procs:
            lines.append("processes per node: " + ", ".join(f"{n}={p}" for n, p in zip(self.participants, self.procs)))
        for cmd in self.commands:
            lines.append(f"[{cmd.node}] cwd: {cmd.cwd}")
            lines.append(f"[{cmd.node}] processes: {cmd.nproc}")
            for k, v in {**cmd.env, **cmd.node_env}.items():
                lines.append(f"[{cmd.node}] env: {k}={v}")
            for k in cmd.secret_env:
                lines.append(f"[{cmd.node}] env: {k}={MASK}")
            for path in cmd.files:
                lines.append(f"[{cmd.node}] file: {path}")
            lines.append(f"[{cmd.node}] argv: {shell_join(cmd.argv)}")
        return "\n".join(lines)


class Launcher(Protocol):
    name: str

    def plan(self, inventory: Inventory, spec: LaunchSpec, entry: EntryPoint) -> LaunchPlan:
        """The plan for running ``entry`` on the first ``spec.nodes`` nodes of ``inventory``."""

    def relabel(self, plan: LaunchPlan):
        """A line relabeler for the runner (see ``remote.Relabel``), or None."""

    def failed_rank(self, log_lines: Sequence[str]) -> int | None:
        """The global rank a node's log names as failed, if the launcher's output says so."""


def nproc_of(spec: LaunchSpec, node: Node) -> int:
    """Processes on ``node``: NPROC, or for NPROC=auto one per GPU on a GPU node and 1 on a CPU node
    (torchrun's ``--nproc-per-node=gpu``, from the inventory rather than the node's own count)."""
    if spec.nproc == "auto":
        return node.accelerator_count if node.accelerator != "none" and node.accelerator_count > 0 else 1
    return int(spec.nproc)


def entry_dir(inventory: Inventory, node_name: str, entry: EntryPoint) -> str:
    """The ranks' working directory: the code dir, or the project (WORKDIR) inside it."""
    base = code_dir(inventory, node_name)
    return f"{base}/{entry.subdir}" if entry.subdir else base


def node_python(inventory: Inventory, spec: LaunchSpec, node_name: str) -> str:
    """The interpreter of the ranks: the node's own SETUP environment (layered on the cluster's), if any."""
    return f"{setup_env_dir(inventory, node_name)}/bin/python" if spec.setup else inventory.interpreter


def grace_env(spec: LaunchSpec) -> dict[str, str]:
    """MULTINODE_GRACE for every rank when GRACE is set (nothing otherwise: SIGTERM keeps its default)."""
    return {GRACE_ENV: f"{spec.grace:g}"} if spec.grace is not None else {}


def bucket_env(spec: LaunchSpec) -> dict[str, str]:
    """MULTINODE_CHECKPOINT_URL for every rank when CHECKPOINT_URL is set (training/upload.py reads it)."""
    return {channel.CHECKPOINT_URL_ENV: spec.checkpoint_url} if spec.checkpoint_url else {}


def data_env(inventory: Inventory, node_name: str, spec: LaunchSpec) -> dict[str, str]:
    """MULTINODE_DATA_DIR, where DATA lies on ``node_name`` (multinode.code.data), when DATA is set."""
    return {"MULTINODE_DATA_DIR": data_dir(inventory, node_name, spec.data_dir)} if spec.data else {}


def preempt_mark(run_directory: str) -> str:
    """The file training.guard writes in the node's run directory when its command ended preempted."""
    return cat(run_directory, "/preempted")


# How a plan's shells treat SIGTERM with GRACE: a shell that must outlive the notice ignores it (an ignored signal
# stays ignored in what it starts); a shell in front of a rank or an agent catches it (a caught signal is the
# default again in what it starts, so the program gets SIGTERM and installs its own handler).
IGNORE_TERM = "trap '' TERM"
CATCH_TERM = "trap : TERM"


def preempted_status(code: str, mark: str) -> str:
    """Shell: the exit status in ``$code``, when not 0, becomes 75 if a guard left its note at ``mark`` (torchrun
    itself exits 1 after a preempted worker: see :mod:`multinode.plan.launchers.torchrun`)."""
    return f'if [ "${code}" != 0 ] && [ -e "{mark}" ]; then {code}={EXIT_PREEMPTED}; fi'


# training.guard and what it imports (standard library only), synced by the orchestrator to every node's code
# directory (multinode.code.prepare) when GRACE is set, and run from there by path: no node, image or SLURM task needs
# our package on its interpreter's path, and a project's own ``training`` package cannot shadow it.
GUARD_SUBDIR = "guard"
GUARD_FILES = ("__init__.py", "guard.py", "imds.py", "notice.py", "channel.py")  # of training/: standard library only


def guard_script(inventory: Inventory, node_name: str) -> str:
    """Where the synced guard lies on ``node_name`` (a container mounts the work directory at the same path)."""
    return f"{code_dir(inventory, node_name)}/{GUARD_SUBDIR}/guard.py"


def guard_argv(inventory: Inventory, spec: LaunchSpec, entry: EntryPoint, script: str,
               every: bool = False) -> tuple[str, ...]:
    """``python -I <code dir>/guard/guard.py --grace G --`` to put before a user script's command when GRACE is set:
    a script that does nothing about notices still gets SIGTERM, the grace and SIGKILL, and exits 75
    (training/guard.py). Our trainer handles notices itself and gets nothing here unless ``every`` (torchrun: the
    guard also keeps the agent from restarting a preempted worker). ``script`` is the node's synced copy
    (:func:`guard_script`; in a batch script, the task's ``$guard``); ``-I``: neither the project's directory nor PYTHONPATH is on the guard's path, and the guard
    loads its siblings by its own location."""
    if spec.grace is None or (entry.ours and not every):
        return ()
    # MULTINODE_GUARD=1 marks the guard itself (not its command) for whoever looks for ranks among the processes.
    return ("env", f"{GUARD_ENV}=1", inventory.interpreter, "-I", script, "--grace", f"{spec.grace:g}", "--")


def project_env(inventory: Inventory, node_name: str, entry: EntryPoint) -> dict[str, str]:
    """A project's ranks import its packages from WORKDIR whichever way they start."""
    return {"PYTHONPATH": entry_dir(inventory, node_name, entry)} if entry.subdir else {}


def project_node_env(inventory: Inventory, node_name: str, entry: EntryPoint) -> dict[str, str]:
    """As :func:`project_env`, evaluated on the node: the project goes first and the node's own PYTHONPATH
    (its environment's, a site's module setup) stays after it."""
    if not entry.subdir:
        return {}
    return {"PYTHONPATH": entry_dir(inventory, node_name, entry) + "${PYTHONPATH:+:$PYTHONPATH}"}


def trainer_args(entry: EntryPoint, run_directory: str, spec: LaunchSpec) -> tuple[str, ...]:
    """Our trainer gets node-local output dirs and the job's timeouts; a user script gets its args untouched."""
    if not entry.ours:
        return entry.args
    extra = ("--snapshot-dir", f"{run_directory}/snapshots", "--metrics-dir", run_directory)
    extra += ("--timeout", str(spec.pg_timeout))
    if spec.uses_gpu:
        extra += ("--device", "gpu")
    return extra + entry.args


BASE_ENV = {
    # torch would otherwise start one OpenMP thread per core in every rank: N ranks x N cores on one box.
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


def collective_env(inventory: Inventory, spec: LaunchSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(env, node_env) pinning gloo -- and NCCL/RCCL in gpu modes -- to the cluster subnet's interface."""
    iface = iface_for_subnet(inventory.subnet)
    env: dict[str, str] = {}
    node_env = {"GLOO_SOCKET_IFNAME": iface}
    if spec.uses_gpu:
        # "=" makes NCCL match the name exactly; without it "ens5" is a prefix and also picks "ens50".
        node_env["NCCL_SOCKET_IFNAME"] = "=" + iface
        # NCCL's socket tuning is left to NCCL: on an AWS ENA (PCI vendor 0x1d0f) it already opens
        # 2 threads x 8 sockets per peer; forcing 4 x 4 doubled its helper threads on a 4-vCPU g4dn.xlarge
        # for no measured gain (NCCL docs, NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD).
    return env, node_env


def per_node_plan(name: str, inv: Inventory, spec: LaunchSpec,
                  node_command: Callable[[int, Node], tuple[tuple[str, ...], dict[str, str]]],
                  entry: EntryPoint | None = None) -> LaunchPlan:
    """The plan of a launcher that runs one command on every node (torchrun, static): ``node_command``
    gives each node's argv and own environment; every node also gets BASE_ENV and the collective env,
    and for a project its directory as cwd and PYTHONPATH, and the ENV file."""
    entry = entry or EntryPoint("")
    network, node_env = collective_env(inv, spec)
    commands = []
    for node_rank, node in enumerate(inv.nodes):
        argv, own_env = node_command(node_rank, node)
        commands.append(NodeCommand(node=node.name, argv=argv, cwd=entry_dir(inv, node.name, entry),
                                    env={**BASE_ENV, **grace_env(spec), **bucket_env(spec), **own_env, **network},
                                    node_env={**project_node_env(inv, node.name, entry),
                                              **data_env(inv, node.name, spec), **node_env},
                                    nproc=nproc_of(spec, node),
                                    env_file=env_file(inv, node.name, spec.run_id) if spec.env else None,
                                    secret_env=tuple(var.name for var in spec.env)))
    return LaunchPlan(run_id=spec.run_id, launcher=name, commands=tuple(commands),
                      participants=tuple(n.name for n in inv.nodes),
                      world_size=sum(nproc_of(spec, node) for node in inv.nodes),
                      procs=tuple(nproc_of(spec, node) for node in inv.nodes))
