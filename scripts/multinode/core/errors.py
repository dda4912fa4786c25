"""Errors the orchestrator reports, and the exit codes they map to.

* :class:`UserError` -- the user asked for something that cannot work (bad value, wrong state).
  One line naming the value and the fix; exit code 2; raised before anything is changed.
* :class:`NodeError` -- a command on a node failed (SSH lost, non-zero exit, deadline).
  Carries the node, the command, the exit code and the last lines of its log
  (in the spirit of SkyPilot's ``CommandError``).
* :class:`CapacityRefused` -- a provider could not give a replacement for a lost node (no capacity).
* :class:`Interrupted` -- a stop signal outside a job's watch (a job's own ending is an
  :class:`~multinode.core.outcome.Outcome`, not an error); a KeyboardInterrupt, so no ``except Exception`` takes it.

Every exit code the command can end with is named here: 0, :data:`EXIT_JOB_FAILED`, :data:`EXIT_USER_ERROR`,
:data:`EXIT_PREEMPTED`, :data:`EXIT_UNAVAILABLE`, and a signal's (:func:`signal_exit`).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from multinode.trainer.channel import EXIT_PREEMPTED  # as the ranks' own: sysexits.h EX_TEMPFAIL, try again

EXIT_USER_ERROR = 2
EXIT_JOB_FAILED = 1
EXIT_UNAVAILABLE = 69  # sysexits.h EX_UNAVAILABLE: a service (here: capacity for a machine) is not available


class MultinodeError(Exception):
    """Base class: everything the CLI turns into a clean message and an exit code (the class's, or the one given
    where the error is made)."""

    exit_code = 1

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code


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


class CapacityRefused(MultinodeError):
    """A provider could not make a replacement for a lost node: EC2 had no capacity (spot or on-demand), or the
    local provider was told to refuse. Nothing was changed; the one line names the node, the reason and what to
    do. Not a :class:`UserError`: the request was right, the machine is not there now (exit 69)."""

    exit_code = EXIT_UNAVAILABLE


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP to the orchestrator outside a job's watch (pre-flight, the syncs, SETUP, between
    attempts): handled as Ctrl-C is -- every ``finally`` and cleanup on the way out runs -- and the command exits
    with the signal's code (:func:`signal_exit`). A job's own ending by a signal is an
    :class:`~multinode.core.outcome.Outcome` (its exit code the same :func:`signal_exit`), not an error."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or signal.Signals(signum).name)
        self.signum, self.message = signum, message or f"interrupted ({signal.Signals(signum).name})"

    @property
    def exit_code(self) -> int:
        return signal_exit(self.signum)


def signal_exit(signum: int) -> int:
    """The exit code of a command a signal ended: 128 + the signal (130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP), as a
    shell reports it."""
    return 128 + signum
