"""The shape every backend has (:class:`Backend`) and what a successful job returns (:class:`JobEnd`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.diagnose.watchdog import StallWatchdog
from multinode.plan.launchers import EntryPoint


@dataclass(frozen=True)
class JobEnd:
    """How a job that succeeded ended: every node's exit code, and its output lines where the backend holds
    them (otherwise the result is read from the head node's log)."""

    exit_codes: dict[str, int | None]
    lines: list[str] = field(default_factory=list)
    stopped_by: str | None = None  # a signal to the orchestrator (Ctrl-C...) that, with GRACE, ended it preempted


class Backend(Protocol):
    """What a backend supplies to the run (``run`` below is the :class:`multinode.app.run.Run` that calls it)."""

    name: str
    reaches_every_node: bool  # the run can SSH to every node of the job (skew check, watchdog, stacks)
    unchecked: str  # what the run says it skipped when it cannot reach every node

    def nodes(self, inventory: Inventory) -> Inventory:
        """The nodes the run connects to."""

    def plan(self, run: Any, entry: EntryPoint) -> Any:
        """The job's plan, pure (``--dry-run`` shows it)."""

    def describe(self, run: Any, job: Any) -> str:
        """The dry run's text."""

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        """Does the head's mpirun reach the other nodes over SSH (checked at pre-flight)?"""

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        """The port the head must accept connections on (pre-flight), or None."""

    def finish_plan(self, run: Any, job: Any) -> Any:
        """The plan completed with what only the nodes can tell (after pre-flight)."""

    def record(self, run: Any, job: Any) -> None:
        """Save the plan in the run directory and say where the run's logs go."""

    def write_files(self, run: Any, job: Any, names: list[str] | None = None) -> None:
        """The plan's files on the nodes (hostfiles, ...)."""

    def run(self, run: Any, job: Any, watchdog: StallWatchdog | None) -> JobEnd:
        """Start the job and watch it until it ends; JobFailed when it failed."""

    def failed_rank(self, run: Any, job: Any, node: str, lines: list[str]) -> int | None:
        """The global rank a failed node's output names, if any."""
