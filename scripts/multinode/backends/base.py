"""What a backend is handed (:class:`RunContext`), the shape every backend has (:class:`Backend`), and what it can see
of the job's nodes (:class:`Reach`, :mod:`multinode.backends.reach`).

A backend plans and starts the job of one attempt of a run (:class:`multinode.app.run.Run`) and hands back its
:class:`JobHandle`: the mechanism (the job's parts, their stop, their notice) that the run's attempt loop
(:mod:`multinode.app.watch`) drives, and the mapping of how the job ended to one
:class:`~multinode.core.outcome.Outcome` -- every decision is the loop's. torchx hands a scheduler one ``AppDef``;
a backend here gets one typed context, never the run itself.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from multinode.code.project import ResolvedProject
from multinode.core.config import LaunchSpec
from multinode.core.errors import NodeError
from multinode.core.events import Events
from multinode.core.inventory import Inventory
from multinode.core.outcome import Ending, Outcome
from multinode.diagnose.capture import Capture
from multinode.diagnose.watchdog import StallWatchdog
from multinode.plan.launchers import EntryPoint
from multinode.plan.runtime import Runtime
from multinode.ssh.runner import RemoteRunner


@dataclass
class RunContext:
    """One attempt of a run, as a backend sees it. ``runner`` is set once the run is connected (a dry run plans
    without it)."""

    spec: LaunchSpec
    inv: Inventory  # the attempt's nodes, head first
    runtime: Runtime
    code: ResolvedProject
    run_dir: Path  # on the control machine: logs, plan, summary
    out: TextIO
    runner: RemoteRunner | None = None


Observe = Callable[[str, str], bool]
"""Every line of the job's output as it arrives, (node, line): True keeps it off the console (the run read it)."""


class JobHandle(Protocol):
    """A started job, as the run's attempt loop drives it. Its parts report their end on the loop's events
    (:class:`~multinode.core.events.NodeEnded` for a node's part, :class:`~multinode.core.events.JobEnded` for a
    scheduler's whole job, :class:`~multinode.core.events.JobError` when it cannot go on)."""

    parts: list[str]  # what the loop waits for: every node (SSH), or the head for the batch job (SLURM)
    notice_words: str  # how the notice reaches the ranks, in words

    def stop(self, names: list[str] | None = None) -> dict[str, bool]:
        """Stop the job (on ``names``; all), under the run's stop policy; {part: it answered}."""

    def notice(self, names: list[str] | None = None) -> bool:
        """GRACE's notice to the ranks (on ``names``; all) (SIGTERM: one coordinated checkpoint, then exit 75); the
        job goes on being watched. True when it reached the job."""

    def drop(self, name: str) -> None:
        """Give up on a part whose node does not answer."""

    def fail_node(self, name: str, message: str, lost: bool) -> NodeError | None:
        """``name``'s failure, recorded (lost: its node is gone or unreachable); None where the job has no such
        node."""

    def lost(self) -> tuple[str, ...]:
        """The nodes lost so far."""

    def relaunch(self, name: str, wait: float, prepare: Callable[[str], None]) -> None:
        """Start a node's part again once it answers (elastic jobs only)."""

    def outcome(self, ending: Ending) -> Outcome:
        """How the job ended, from the loop's :class:`~multinode.core.outcome.Ending` and the backend's own account."""

    def close(self) -> None:
        """The job is over for the run: its files closed, what is left of it cancelled."""


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

    def hold(self, ctx: RunContext) -> AbstractContextManager[Claim]:
        """The run's connections opened (``ctx.runner``) and its claim taken, both given back on exit."""

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

    def start(self, ctx: RunContext, plan: JobPlan, events: Events, observe: Observe) -> JobHandle:
        """Start the job (NodeError: it could not be started); its handle. Its parts report on ``events``, its
        output lines go through ``observe``."""

    def failed_rank(self, ctx: RunContext, plan: JobPlan, node: str, lines: list[str]) -> int | None:
        """The global rank a failed node's output names, if any."""

