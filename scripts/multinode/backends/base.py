"""What a backend is handed (:class:`RunContext`), the shape every backend has (:class:`Backend`), and what it can see
of the job's nodes (:class:`Reach`, :mod:`multinode.backends.reach`).

A backend plans, starts, watches and stops the job of one attempt of a run (:class:`multinode.app.run.Run`); its
run returns one :class:`~multinode.core.outcome.Outcome` and raises nothing for how the job ended. torchx hands a
scheduler one ``AppDef``; a backend here gets one typed context, never the run itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from multinode.code.project import ResolvedProject
from multinode.core.config import LaunchSpec
from multinode.core.errors import NodeError
from multinode.core.inventory import Inventory
from multinode.core.outcome import Outcome
from multinode.diagnose.capture import Capture
from multinode.diagnose.watchdog import StallWatchdog
from multinode.plan.launchers import EntryPoint
from multinode.plan.runtime import Runtime
from multinode.ssh.runner import RemoteRunner


@dataclass
class RunContext:
    """One attempt of a run, as a backend sees it. ``runner``, ``watchdog`` and the two hooks are set once the run
    is connected (a dry run plans with none of them)."""

    spec: LaunchSpec
    inv: Inventory  # the attempt's nodes, head first
    runtime: Runtime
    code: ResolvedProject
    run_dir: Path  # on the control machine: logs, plan, summary
    out: TextIO
    runner: RemoteRunner | None = None
    watchdog: StallWatchdog | None = None
    # Before a failed or stalled job is stopped: the run's look at the live ranks (the failure, the lost nodes).
    before_stop: Callable[[NodeError, tuple[str, ...]], None] | None = None
    # A node that comes back (MAX_RESTARTS) gets the code, the job's files and the ENV file again.
    prepare_again: Callable[[str], None] | None = None
    # Every line of the job's output as it arrives, (node, line): True keeps it off the console (the run read it).
    observe: Callable[[str, str], bool] | None = None


class JobPlan(Protocol):
    """A backend's plan: a launcher's :class:`~multinode.plan.launchers.LaunchPlan` (ssh), a SlurmJob (slurm)."""

    world_size: int


class Claim(Protocol):
    """The run's hold on the cluster (:class:`multinode.backends.claim.Claim`), taken again after its head is replaced."""

    def take(self) -> None: ...

    def release(self) -> None: ...


class Reach(Protocol):
    """What the run can see of the job's nodes. Where it reaches every node over SSH, all of it; where a scheduler
    owns nodes the run cannot reach (a SLURM site described by its login node), none of it, said once."""

    def claim(self, ctx: RunContext) -> Claim:
        """The cluster's claim for the run (not yet taken)."""

    def software_probes(self, ctx: RunContext) -> dict[str, str]:
        """Each node's software probe for the pre-flight round ({} where it is not compared)."""

    def check_software(self, ctx: RunContext, answers: dict[str, str] | None) -> None:
        """The skew check on the pre-flight's answers (PreflightFailed, one line)."""

    def link_check(self, ctx: RunContext, mode: str, after_failure: bool = False) -> dict | None:
        """The link check's report (LINKCHECK at pre-flight; ``report`` after a broken connection), or None."""

    def watchdog(self, ctx: RunContext) -> StallWatchdog | None:
        """The stall watchdog of the attempt (STALL_TIMEOUT), or None."""

    def capture(self, ctx: RunContext, failure: NodeError, lost: tuple[str, ...]) -> Capture | None:
        """The stacks of the live ranks before a failed job is stopped (the lost nodes are not asked)."""

    def metrics(self, ctx: RunContext) -> str | None:
        """Rank 0's metrics fetched into the run directory (our trainer), or None."""


class Backend(Protocol):
    """What a backend supplies to the run. Made once per attempt by :func:`multinode.backends.backend_for`."""

    name: str
    reach: Reach

    def nodes(self, inventory: Inventory) -> Inventory:
        """The nodes the run connects to."""

    def plan(self, ctx: RunContext, entry: EntryPoint) -> JobPlan:
        """The job's plan, pure (``--dry-run`` shows it)."""

    def describe(self, ctx: RunContext, plan: JobPlan) -> str:
        """The dry run's text."""

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        """Does the head's mpirun reach the other nodes over SSH (checked at pre-flight)?"""

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        """The port the head must accept connections on (pre-flight), or None."""

    def finish_plan(self, ctx: RunContext, plan: JobPlan) -> JobPlan:
        """The plan completed with what only the nodes can tell (after pre-flight)."""

    def record(self, ctx: RunContext, plan: JobPlan) -> None:
        """Save the plan in the run directory and say where the run's logs go."""

    def write_files(self, ctx: RunContext, plan: JobPlan, names: list[str] | None = None) -> None:
        """The plan's files on the nodes (hostfiles, ...)."""

    def run(self, ctx: RunContext, plan: JobPlan) -> Outcome:
        """Start the job and watch it until it ends; how it ended."""

    def notice(self, ctx: RunContext) -> bool:
        """GRACE's notice to the ranks of the running job (SIGTERM: one coordinated checkpoint, then exit 75); the
        job goes on being watched by :meth:`run`, which then returns it preempted. True when it reached the job."""

    def failed_rank(self, ctx: RunContext, plan: JobPlan, node: str, lines: list[str]) -> int | None:
        """The global rank a failed node's output names, if any."""

