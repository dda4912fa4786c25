"""Errors the orchestrator reports, and the exit codes they map to.

* :class:`UserError` -- the user asked for something that cannot work (bad value, wrong state).
  One line naming the value and the fix; exit code 2; raised before anything is changed.
* :class:`NodeError` -- a command on a node failed (SSH lost, non-zero exit, deadline).
  Carries the node, the command, the exit code and the last lines of its log
  (in the spirit of SkyPilot's ``CommandError``).
* :class:`JobFailed` -- a training run failed; names the first node (and rank) that failed.
* :class:`CapacityRefused` -- a provider could not give a replacement for a lost node (no capacity).
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_USER_ERROR = 2
EXIT_JOB_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL, as the ranks' own (training/preempt.py): try again, it will work
EXIT_UNAVAILABLE = 69  # sysexits.h EX_UNAVAILABLE: a service (here: capacity for a machine) is not available


class MultinodeError(Exception):
    """Base class: everything the CLI turns into a clean message and an exit code."""

    exit_code = 1


class UserError(MultinodeError, ValueError):
    """Bad input or wrong state. ``str(err)`` is the one line shown to the user."""

    exit_code = EXIT_USER_ERROR


class PreflightFailed(UserError):
    """A node cannot run the job; nothing was started."""


class NodeError(MultinodeError):
    """A command failed on one node."""

    def __init__(
        self,
        node: str,
        command: str,
        exit_code: int | None,
        message: str,
        tail: Sequence[str] = (),
        log_path: str | None = None,
    ) -> None:
        self.node = node
        self.command = command
        self.returncode = exit_code
        self.message = message
        self.tail = list(tail)
        self.log_path = log_path
        super().__init__(self.describe())

    def describe(self) -> str:
        code = "no exit code" if self.returncode is None else f"exit code {self.returncode}"
        lines = [f"{self.node}: {self.message} ({code})"]
        if self.tail:
            lines.append(f"last lines of {self.node}:")
            lines.extend(f"  {line}" for line in self.tail)
        if self.log_path:
            lines.append(f"full log: {self.log_path}")
        return "\n".join(lines)


class JobFailed(MultinodeError):
    """A job ended badly; ``first`` is the failure that ended it, ``failures`` every node's failure in the order
    they ended, ``exit_codes`` how each node ended (None: lost or never finished)."""

    exit_code = EXIT_JOB_FAILED

    def __init__(self, first: NodeError, rank: int | None = None, summary: str = "",
                 failures: Sequence[NodeError] = (), exit_codes: dict[str, int | None] | None = None) -> None:
        self.first = first
        self.rank = rank
        self.summary = summary
        self.failures = list(failures)
        self.exit_codes = dict(exit_codes or {})
        where = first.node if rank is None else f"{first.node} (rank {rank})"
        super().__init__(f"job failed first on {where}: {first.message}")


class Preempted(MultinodeError):
    """Every rank stopped at one step on a notice and the snapshot was written: not a failure (exit 75);
    ``summary`` says where the copies are and how to resume."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, summary: str) -> None:
        self.summary = summary
        super().__init__("preempted: every rank stopped at one step and its snapshot was kept")


class CapacityRefused(MultinodeError):
    """A provider could not make a replacement for a lost node: EC2 had no capacity (spot or on-demand), or the
    local provider was told to refuse. Nothing was changed; the one line names the node, the reason and what to
    do. Not a :class:`UserError`: the request was right, the machine is not there now (exit 69)."""

    exit_code = EXIT_UNAVAILABLE


class Interrupted(MultinodeError):
    """Ctrl-C: every node was stopped."""

    exit_code = EXIT_INTERRUPTED
