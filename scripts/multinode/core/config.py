"""Typed, validated-once configuration for the orchestrator.

Precedence is CLI flag > environment (the Makefile passes ``NODES=2`` etc. through as
``MULTINODE_NODES``...) > default; for ``train`` a task file sits before the default
(:mod:`multinode.core.taskfile`, :mod:`multinode.core.sources`). Each spec is a frozen dataclass that validates itself in
``__post_init__`` and raises :class:`UserError` with one actionable line, so nothing downstream
re-checks user input.

A field a user sets is declared as a setting where it stands (``setting(default, KIND, help, ...)``,
:mod:`multinode.core.setting`): its kind, default, help, make variable and task key. The flags, the task keys,
the Makefile's exports and the docs' tables are derived from these declarations (:mod:`multinode.core.settings`).
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from multinode.core.envvars import EnvVar
from multinode.core import preemption
from multinode.core.preemption import DEFAULT_RECOVER_WAIT
from multinode.core.errors import UserError
from multinode.core.setting import (
    ARGS, COMMAND_LINE, ENV, NPROC, PATH, RANGE, SCRIPT, SECONDS, SWITCH, TEXT, WHOLE, setting,
)
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

    name: str = DEFAULT_CLUSTER  # the setting CLUSTER (every verb's --cluster): multinode.core.settings
    provider: str = setting("local", TEXT, "local (simulated nodes on this machine), aws (EC2) or hosts (an existing "
                            "cluster by its login node)", see="[aws.md](aws.md), [slurm.md](slurm.md)")
    nodes: int = setting(2, WHOLE, "number of nodes")
    cluster_type: str = setting("cpu", TEXT, f"AWS: {', '.join(CLUSTER_TYPES)} (NVIDIA T4, AMD Radeon Pro V520)")
    mtu: int = setting(DEFAULT_MTU, WHOLE, "local provider: the links' MTU (1500 tries Ethernet-sized packets)")
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


BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules (3-63 characters)


def split_bucket_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix/"); ("bucket", "") for the whole bucket."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _check_buckets(spec: "LaunchSpec") -> None:
    """DATA, DATA_DIR, CHECKPOINT_URL: the form only (whether the bucket exists is pre-flight's, on the nodes)."""
    for name, url in (("DATA", spec.data), ("CHECKPOINT_URL", spec.checkpoint_url)):
        if url is None:
            continue
        if not url.startswith("s3://"):
            raise UserError(f"{name}={url!r} is not a bucket URL; give it as s3://bucket/prefix")
        if not BUCKET.match(split_bucket_url(url)[0]):
            raise UserError(f"{name}={url!r}: {split_bucket_url(url)[0]!r} is not a bucket name (3-63 lower-case "
                            f"letters, digits, dots and hyphens); give it as s3://bucket/prefix")
    if spec.data_dir is not None and spec.data is None:
        raise UserError(f"DATA_DIR={spec.data_dir} says where DATA lands on the nodes, but DATA is not set; set "
                        f"DATA=s3://bucket/prefix or drop DATA_DIR")
    if spec.data_dir is not None and not spec.data_dir.startswith("/"):
        raise UserError(f"DATA_DIR={spec.data_dir!r} must be an absolute path on the nodes, e.g. /data; leave it "
                        f"unset for each node's work directory's data/")


@dataclass(frozen=True)
class LaunchSpec:
    """What `train` runs. ``nodes`` is how many of the cluster's nodes take part (head first)."""

    nodes: int = setting(2, WHOLE, "nodes taking part (head first)", task=True)
    mode: str = setting("cpu", TEXT, f"one of {', '.join(MODES)}", task=True)
    nproc: int | str = setting(1, NPROC, "processes per node, or auto (one per GPU on GPU nodes, 1 on CPU nodes)",
                               task=True)
    script: str | None = setting(None, SCRIPT, "a script (a path in WORKDIR) or '-m package.module [args]'; unset: "
                                 "our trainer", task=True, see="[trainer.md](trainer.md)")
    args: tuple[str, ...] = setting(DEFAULT_TRAIN_ARGS, ARGS, "arguments for the script, one string (with a SCRIPT: "
                                    "none by default)", task=True)
    workdir: str | None = setting(None, PATH, "the project directory synced to every node (unset: SCRIPT's "
                                  "directory; '.' for -m)", task=True, see="[projects.md](projects.md)")
    workdir_limit_mb: int = setting(200, WHOLE, "a WORKDIR larger than this is refused", task=True)
    setup: str | None = setting(None, TEXT, "command run once per node in WORKDIR before the job (again when it or "
                                "its files change)", task=True, see="[projects.md](projects.md)")
    # make passes ENV on only from its command line: a shell's own $ENV (its startup file, in some setups) is not
    # a variable list.
    env: tuple[EnvVar, ...] = setting((), ENV, "variables for every rank: NAME (your environment's value) or "
                                      "NAME=value; values are never shown", task=True, metavar='"NAME OTHER=value"',
                                      make=COMMAND_LINE)
    launcher: str = setting("auto", TEXT, "torchrun modes: static (no agents), torchrun (agents: elastic, restarts) "
                            "or auto (torchrun only with ELASTIC or MAX_RESTARTS)", task=True,
                            see="[Launchers](#launchers)")
    max_restarts: int = setting(0, WHOLE, "torchrun restarts per node; a node that comes back rejoins", task=True,
                                see="[failures.md](failures.md#elastic-runs-max_restarts)")
    elastic: str | None = setting(None, RANGE, "MIN:MAX elastic node range, passed to torchrun (unset: static)",
                                  task=True, metavar="MIN:MAX")
    rdzv_port: int = setting(29500, WHOLE, "the rendezvous port on node-0", task=True)
    rdzv_timeout: int = setting(60, WHOLE, "seconds the peers' agents hold the rendezvous open for a node that "
                                "rejoins", task=True, make=None)
    pg_timeout: int = setting(30, WHOLE, "seconds a collective waits for a dead peer (our trainer's process-group "
                              "timeout)", task=True, make=None)
    deadline: float | None = setting(None, SECONDS, "seconds the job may take (unset: no limit)", task=True,
                                     make=None)
    stall_timeout: float = setting(DEFAULT_STALL_TIMEOUT, SECONDS, "seconds without progress (step heartbeat, "
                                   "output, CPU) before the job is ended naming the culprit; 0: off", task=True)
    skew: str = setting("refuse", TEXT, f"nodes whose software differs: {' or '.join(SKEW_MODES)} "
                        "(multinode.checks.software)", task=True, see="[failures.md](failures.md#software-skew)")
    linkcheck: str = setting("refuse", TEXT, "a node whose link is far slower than the others' at pre-flight: "
                             f"{', '.join(LINKCHECK_MODES)}", task=True,
                             see="[network.md](network.md#the-link-check-pre-flight)")
    # Preemption and recovery (docs/preemption.md, docs/recovery.md):
    grace: float | None = setting(None, SECONDS, "seconds: SIGTERM to a rank is a notice (one coordinated "
                                  "checkpoint, exit 75; the ranks get it as MULTINODE_GRACE) and every stop waits "
                                  "that long before SIGKILL", task=True, metavar="SECONDS",
                                  see="[preemption.md](preemption.md)")
    resume: bool = setting(False, SWITCH, "continue the cluster's latest run that did not finish (preempted, "
                           "failed or stopped), under its run id, from its freshest snapshot", task=True,
                           see="[recovery.md](recovery.md)")
    recover: int = setting(0, WHOLE, "recoveries allowed after a preemption or a lost node (0: off): replace that "
                           "node, or go on with fewer at the same global batch, and resume", task=True, metavar="N",
                           see="[recovery.md](recovery.md)")
    recover_wait: float = setting(DEFAULT_RECOVER_WAIT, SECONDS, "seconds to wait for a replacement node before "
                                  "going on without it; also how often a run on fewer nodes asks again", task=True,
                                  metavar="SECONDS")
    recover_restart: bool = setting(False, SWITCH, "RECOVER: every process restarts from the freshest snapshot "
                                    "through a lost or noticed node (unset: the surviving ranks keep their processes)",
                                    task=True, see="[recovery.md](recovery.md)")
    # Buckets (docs/data.md, docs/checkpoints.md): each node reads and writes them itself.
    data: str | None = setting(None, TEXT, "s3://bucket/prefix synced to DATA_DIR on every node before the job "
                               "(only what changed, by ETag and size)", task=True, metavar="s3://BUCKET/PREFIX",
                               see="[data.md](data.md)")
    data_dir: str | None = setting(None, TEXT, "where DATA lands on each node, an absolute path (unset: "
                                   "data/ in the node's work directory)", task=True, metavar="PATH",
                                   see="[data.md](data.md)")
    checkpoint_url: str | None = setting(None, TEXT, "s3://bucket/prefix: every snapshot of our trainer is uploaded "
                                         "there from its node; RESUME=1 on a new cluster continues from it",
                                         task=True, metavar="s3://BUCKET/PREFIX",
                                         see="[checkpoints.md](checkpoints.md)")
    # Per command, not part of a task:
    run_id: str = setting(None, TEXT, "the run's id (unset: a new one, date-time-random)", default_factory=new_run_id,
                          make=None)
    dry_run: bool = setting(False, SWITCH, "print each node's exact command and environment (or the sbatch "
                            "script), run nothing")
    queue: bool = setting(False, SWITCH, "a cluster with a run in progress: wait for it to end instead of being "
                          "refused")
    # Not a setting (tests and benchmarks set it): seconds for every node to answer SSH and pass its checks.
    preflight_timeout: float = 15.0
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
        preemption.check(self)
        if self.recover and self.grace is None:  # derived once, here: every later spec is a copy of this one
            object.__setattr__(self, "grace", preemption.recovery_grace(self))
        _check_buckets(self)

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
