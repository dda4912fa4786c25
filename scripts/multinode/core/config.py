"""Typed, validated-once configuration for the orchestrator.

Precedence is CLI flag > environment (the Makefile passes ``NODES=2`` etc. through as
``MULTINODE_NODES``...) > default; for ``train`` a task file sits before the default
(:mod:`multinode.core.taskfile`, :mod:`multinode.core.sources`). Each spec is a frozen dataclass that validates itself in
``__post_init__`` and raises :class:`UserError` with one actionable line, so nothing downstream
re-checks user input.
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from multinode.core.envvars import EnvVar
from multinode.core.errors import UserError
from multinode.core.state import check_cluster_name

MODES = ("cpu", "gpu", "mpi", "mpi-gpu")
# How torchrun modes start ranks: torchrun agents, or the orchestrator itself (static); "auto" is static
# for a fixed-size job and torchrun when ELASTIC or MAX_RESTARTS asks for what only agents can do.
TORCH_LAUNCHERS = ("auto", "torchrun", "static")
CLUSTER_TYPES = ("cpu", "g4dn", "g4ad")
DEFAULT_CLUSTER = "dev"
# Local links are veth pairs inside one kernel: the MTU only sets how many packets (and how much per-packet CPU)
# a transfer costs. At 1500 the 2-core host spends on packets what it should spend on the job, so two
# namespaces reach ~0.7x the busbw of one (loopback's MTU is 65536); at 65000 they reach ~0.99x
# (docs/benchmarks.md, MTU sweep). MTU=1500 remains available for trying Ethernet-sized packets.
DEFAULT_MTU = 65000
# Seconds without progress (step heartbeat, output or CPU time) before the stall watchdog ends a job; 0: off.
# See multinode.diagnose.watchdog for why 300.
DEFAULT_STALL_TIMEOUT = 300
SKEW_MODES = ("refuse", "warn")  # nodes whose software differs: refuse the job at pre-flight, or warn and run
LINKCHECK_MODES = ("refuse", "warn", "off")  # a slow link at pre-flight: refuse, warn and run, or measure nothing
DEFAULT_TRAIN_ARGS = ("--workload", "digits", "10", "5")  # total_epochs=10, save_every=5
# Seconds a run waits for a replacement node before it goes on with fewer nodes (RECOVER_WAIT).
DEFAULT_RECOVER_WAIT = 120.0


def env_default(name: str, default: str | None = None) -> str | None:
    """``MULTINODE_<NAME>`` from the environment (empty counts as unset)."""
    value = os.environ.get(f"MULTINODE_{name}")
    return value if value not in (None, "") else default


def new_run_id() -> str:
    """Sortable and unique: 20261122-135501-1a2b3c."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def _positive(name: str, value: int, hint: str) -> None:
    if value < 1:
        raise UserError(f"{name}={value} must be at least 1; {hint}")


@dataclass(frozen=True)
class ClusterSpec:
    """What `up` provisions."""

    name: str = DEFAULT_CLUSTER
    provider: str = "local"
    nodes: int = 2
    cluster_type: str = "cpu"  # cpu | g4dn | g4ad (the AWS kinds; local is always cpu)
    mtu: int = DEFAULT_MTU  # local provider: veth MTU
    options: dict[str, str] = field(default_factory=dict)  # provider-specific (region, ssh_cidr, ...)

    def __post_init__(self) -> None:
        check_cluster_name(self.name)
        _positive("NODES", self.nodes, "a cluster needs at least one node.")
        if self.nodes > 64:
            raise UserError(f"NODES={self.nodes} is more than 64; lower NODES.")
        if self.cluster_type not in CLUSTER_TYPES:
            raise UserError(
                f"unknown CLUSTER_TYPE {self.cluster_type!r}; valid cluster types: {', '.join(CLUSTER_TYPES)}"
            )
        if not 576 <= self.mtu <= 65535:
            raise UserError(f"MTU={self.mtu} is outside 576..65535; use 65000 (the default) or 1500 (Ethernet-sized)")


ELASTIC = re.compile(r"^(\d+):(\d+)$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _check_preemption(spec: "LaunchSpec") -> None:
    """GRACE, RESUME, RECOVER, RECOVER_WAIT: one line naming the value and the fix."""
    if spec.grace is not None and not spec.grace > 0:
        raise UserError(f"GRACE={spec.grace:g} must be a positive number of seconds, e.g. GRACE=60 (the time ranks "
                        f"get between SIGTERM and SIGKILL); leave GRACE unset for none")
    if not isinstance(spec.resume, bool):
        raise UserError(f"RESUME={spec.resume!r} must be 1 (continue the latest preempted run) or 0")
    if spec.recover < 0:
        raise UserError(f"RECOVER={spec.recover} must be 0 (off) or the number of recoveries allowed, e.g. RECOVER=2")
    if spec.recover_wait < 0:
        raise UserError(f"RECOVER_WAIT={spec.recover_wait:g} must be 0 or more seconds to wait for a replacement "
                        f"node, e.g. RECOVER_WAIT={DEFAULT_RECOVER_WAIT:g}")


@dataclass(frozen=True)
class LaunchSpec:
    """What `train` runs. ``nodes`` is how many of the cluster's nodes take part (head first)."""

    mode: str = "cpu"
    nodes: int = 2
    nproc: int | str = 1  # processes per node, or "auto": one per GPU on GPU nodes, 1 on CPU nodes
    script: str | None = None  # None: our trainer (training/train.py); a path in WORKDIR, or "-m pkg.module [args]"
    args: tuple[str, ...] = DEFAULT_TRAIN_ARGS
    rdzv_port: int = 29500
    max_restarts: int = 0
    elastic: str | None = None  # "MIN:MAX" nodes; None = static (MIN = MAX = nodes)
    rdzv_timeout: int = 60  # seconds to wait for every node to join the rendezvous
    pg_timeout: int = 30  # seconds a collective may wait for a dead peer before the job fails
    deadline: float | None = None  # seconds the whole job may take; None = no limit
    preflight_timeout: float = 15.0  # seconds for every node to answer SSH and pass its checks (retries included)
    run_id: str = field(default_factory=new_run_id)
    dry_run: bool = False
    queue: bool = False  # a cluster with a run in progress: wait for it (QUEUE=1) instead of being refused
    launcher: str = "auto"  # torchrun modes: one of TORCH_LAUNCHERS
    workdir: str | None = None  # the project directory synced to every node (default: SCRIPT's directory)
    workdir_limit_mb: int = 200  # a WORKDIR larger than this is refused
    setup: str | None = None  # shell command run once per node in WORKDIR before the job (e.g. pip install -r ...)
    env: tuple[EnvVar, ...] = ()  # variables for every rank (values never shown)
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # seconds without progress before the job is ended; 0 = off
    skew: str = "refuse"  # one of SKEW_MODES (multinode.checks.software)
    linkcheck: str = "refuse"  # one of LINKCHECK_MODES (multinode.checks.links)
    # Preemption and recovery (docs/preemption.md, docs/recovery.md):
    grace: float | None = None  # GRACE: SIGTERM is a notice to the ranks (MULTINODE_GRACE), killed that long after
    resume: bool = False  # RESUME=1: continue the cluster's latest preempted or interrupted run
    recover: int = 0  # RECOVER=N: recoveries allowed after losing nodes (0: off)
    recover_wait: float = DEFAULT_RECOVER_WAIT  # seconds to wait for a replacement before going on with fewer nodes

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"unknown MODE {self.mode!r}; valid modes: {', '.join(MODES)}")
        if self.launcher not in TORCH_LAUNCHERS:
            raise UserError(f"unknown LAUNCHER {self.launcher!r}; valid launchers: {', '.join(TORCH_LAUNCHERS)}")
        if self.mode.startswith("mpi") and self.launcher != "auto":
            raise UserError(f"LAUNCHER={self.launcher} is for torchrun modes; MODE={self.mode} always starts ranks "
                            f"with mpirun: drop LAUNCHER")
        if self.launcher == "static" and (self.elastic or self.max_restarts):
            raise UserError("LAUNCHER=static starts a fixed set of ranks without agents; "
                            "use LAUNCHER=torchrun with ELASTIC or MAX_RESTARTS")
        _positive("NODES", self.nodes, "run on at least one node.")
        if isinstance(self.nproc, str):
            if self.nproc != "auto":
                raise UserError(f"NPROC={self.nproc!r} must be a number or auto (one process per GPU, 1 on CPU nodes)")
        else:
            _positive("NPROC", self.nproc, "start at least one process per node.")
        if self.script is not None and self.script.lstrip().startswith("-m"):
            try:
                words = shlex.split(self.script)
            except ValueError as err:
                raise UserError(f"SCRIPT={self.script!r} cannot be split like a shell line ({err}); check its quotes") from None
            if words[0] != "-m" or len(words) < 2 or not MODULE.match(words[1]):
                raise UserError(f"SCRIPT={self.script!r} must look like '-m package.module [args]', e.g. SCRIPT=\"-m pkg.train\"")
        if self.workdir is not None and self.script is None:
            raise UserError(f"WORKDIR={self.workdir} needs SCRIPT: a path inside it or '-m package.module'")
        if self.setup is not None and self.script is None:
            raise UserError("SETUP prepares a project's environment and needs SCRIPT (and WORKDIR); our trainer needs none")
        _positive("WORKDIR_LIMIT_MB", self.workdir_limit_mb, "raise it to sync a larger WORKDIR.")
        if not 1024 <= self.rdzv_port <= 65535:
            raise UserError(f"RDZV_PORT={self.rdzv_port} must be in 1024..65535")
        if self.max_restarts < 0:
            raise UserError(f"MAX_RESTARTS={self.max_restarts} must be 0 or more")
        if self.elastic is not None:
            match = ELASTIC.match(self.elastic)
            if not match or not 1 <= int(match[1]) <= int(match[2]):
                raise UserError(f"ELASTIC={self.elastic!r} must look like MIN:MAX with 1 <= MIN <= MAX, e.g. 1:{self.nodes}")
            if int(match[2]) != self.nodes:
                raise UserError(f"ELASTIC={self.elastic!r}: MAX must equal NODES={self.nodes}")
            if self.mode.startswith("mpi"):
                raise UserError(f"ELASTIC is for torchrun modes; MODE={self.mode} runs a fixed mpirun world")
        if self.mode.startswith("mpi") and self.max_restarts:
            raise UserError(f"MAX_RESTARTS is for torchrun modes; MODE={self.mode} cannot restart ranks")
        if self.skew not in SKEW_MODES:
            raise UserError(f"SKEW={self.skew!r} is not one of {', '.join(SKEW_MODES)}; "
                            f"SKEW=warn runs on nodes whose software differs")
        if self.linkcheck not in LINKCHECK_MODES:
            raise UserError(f"LINKCHECK={self.linkcheck!r} is not one of {', '.join(LINKCHECK_MODES)}; "
                            f"LINKCHECK=warn runs on a cluster with a slow link")
        if self.stall_timeout < 0:
            raise UserError(f"STALL_TIMEOUT={self.stall_timeout:g} must be 0 (off) or a number of seconds, "
                            f"e.g. {DEFAULT_STALL_TIMEOUT}")
        for name in ("rdzv_timeout", "pg_timeout"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.upper()}={getattr(self, name)} must be at least 1 second")
        _check_preemption(self)

    @property
    def module(self) -> str | None:
        """``pkg.train`` for SCRIPT="-m pkg.train ..."; None for a script path."""
        return shlex.split(self.script)[1] if self.script and self.script.lstrip().startswith("-m") else None

    @property
    def entry_args(self) -> tuple[str, ...]:
        """What follows the module in SCRIPT="-m pkg.train a b", then ARGS."""
        return (tuple(shlex.split(self.script)[2:]) if self.module else ()) + self.args

    @property
    def agents(self) -> bool:
        """Do torchrun agents start the ranks (torchrun modes)? Only they restart ranks or change the world size."""
        if self.launcher == "auto":
            return bool(self.elastic or self.max_restarts)
        return self.launcher == "torchrun"

    @property
    def uses_gpu(self) -> bool:
        return self.mode in ("gpu", "mpi-gpu")

    @property
    def uses_mpi(self) -> bool:
        return self.mode.startswith("mpi")
