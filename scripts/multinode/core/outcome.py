"""How a job ended, as one typed value: what every backend's run returns and every summary is built from.

Six kinds, each with what it needs (torch elastic's ``RunResult``/``WorkerState`` is the model):

* ``succeeded`` -- every node ended 0;
* ``preempted`` -- the ranks stopped at one step on a notice and kept a snapshot (a node reported 75, none anything
  but 0 or 75); ``stopped_by`` names the signal to the orchestrator when its own notice (GRACE) did it;
* ``failed`` -- a node exited non-zero, or the job's deadline passed; ``failure`` is the failure that ended it;
* ``lost`` -- the failure that ended it was a node whose SSH session died, that stopped answering or whose machine
  the provider says is gone; ``lost`` names every such node (confirmed by the run's probes when it recovers) and
  ``why_lost`` says why;
* ``stalled`` -- the stall watchdog saw no progress and ended the job; ``failure`` says for how long;
* ``interrupted`` -- Ctrl-C, SIGTERM or SIGHUP to the orchestrator stopped the job on every node.

Nothing downstream reads a failure's wording to learn which kind it is. The exit code of each kind is here:
0, 75 (sysexits EX_TEMPFAIL, as the ranks' own), 1, or 128 + the signal.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from multinode.core.errors import EXIT_JOB_FAILED, EXIT_PREEMPTED, NodeError, signal_exit
from multinode.trainer.channel import EXIT_PEER_FAILED

# A node's exit code that says nothing of its own failure: ended well, its collective failed, or stopped by the run
# (SIGTERM, then SIGKILL: 128 + the signal, or minus it where Python reports a child killed by one).
BY_THE_JOB_OR_STOP = {0, None, EXIT_PREEMPTED, EXIT_PEER_FAILED, 128 + signal.SIGTERM, 128 + signal.SIGKILL,
                      -signal.SIGTERM, -signal.SIGKILL}
OUTCOMES = ("succeeded", "preempted", "failed", "lost", "stalled", "interrupted")
FAILURES = ("failed", "lost", "stalled")  # the kinds with a root cause to find


@dataclass(frozen=True)
class Outcome:
    """How one job ended (see the module doc)."""

    kind: str  # one of OUTCOMES
    exit_codes: dict[str, int | None]  # every node's exit code (None: lost, or it never finished)
    failure: NodeError | None = None  # failed / lost / stalled / interrupted: what ended it
    failures: tuple[NodeError, ...] = ()  # every node's failure, in the order they ended
    lost: tuple[str, ...] = ()  # the nodes whose SSH session died or that stopped answering
    why_lost: dict[str, str] = field(default_factory=dict)  # each lost node: why (no SSH, its machine gone)
    stopped_by: str | None = None  # the signal to the orchestrator (interrupted; preempted by its own notice)
    lines: tuple[str, ...] = ()  # the job's output where the backend holds it (SLURM); else the nodes' logs

    def __post_init__(self) -> None:
        if self.kind not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.kind!r}; one of {', '.join(OUTCOMES)}")
        if self.kind in FAILURES + ("interrupted",) and self.failure is None:
            raise ValueError(f"a {self.kind} outcome names its failure")

    @classmethod
    def ended(cls, exit_codes: dict[str, int | None], stopped_by: str | None = None,
              lines: tuple[str, ...] = ()) -> "Outcome":
        """Every node ended by itself with 0 or 75 (:func:`ended_by_itself`): preempted if one said 75, else
        succeeded."""
        kind = "preempted" if EXIT_PREEMPTED in exit_codes.values() else "succeeded"
        return cls(kind, dict(exit_codes), stopped_by=stopped_by, lines=lines)

    @classmethod
    def after_signal(cls, signum: int, noticed: bool, what: str, node: str, exit_codes: dict[str, int | None],
                     lines: tuple[str, ...] = ()) -> "Outcome":
        """A stop signal to the orchestrator, given to the ranks as a notice (GRACE: ``noticed``) or not: preempted
        when it was and every node then ended by itself with its checkpoint (0 or 75, a 75 among them), else
        interrupted (``what``)."""
        if noticed and EXIT_PREEMPTED in exit_codes.values() and ended_by_itself(exit_codes):
            return cls.ended(exit_codes, stopped_by=signal.Signals(signum).name, lines=lines)
        return cls.interrupted(signum, what, node, exit_codes, lines)

    @classmethod
    def interrupted(cls, signum: int, message: str, node: str, exit_codes: dict[str, int | None],
                    lines: tuple[str, ...] = ()) -> "Outcome":
        """The orchestrator was stopped by ``signum``: the job was stopped on every node."""
        name = signal.Signals(signum).name
        return cls("interrupted", dict(exit_codes), failure=NodeError(node, "job", None, message), stopped_by=name,
                   lines=lines)

    @property
    def exit_code(self) -> int:
        """What the orchestrator exits with."""
        if self.kind == "succeeded":
            return 0
        if self.kind == "preempted":
            return EXIT_PREEMPTED
        if self.kind == "interrupted":
            return signal_exit(signal.Signals[self.stopped_by].value)
        return EXIT_JOB_FAILED

    @property
    def is_failure(self) -> bool:
        return self.kind in FAILURES

    @property
    def peers_failed(self) -> bool:
        """A failure in the job's collectives alone: the first node to fail exited ``EXIT_PEER_FAILED`` (its ranks'
        collective failed: a peer gone, or slower than the process-group timeout), no node was lost, and every
        other node ended well, the same way, or by the run's own stop (SIGTERM, then SIGKILL) -- no rank failed in
        a way of its own that a restart would meet again."""
        return (self.kind == "failed" and not self.lost and self.failure is not None
                and self.failure.returncode == EXIT_PEER_FAILED and set(self.exit_codes.values()) <= BY_THE_JOB_OR_STOP)


def ended_by_itself(exit_codes: dict[str, int | None]) -> bool:
    """Every node ended with 0 or 75 (a notice's checkpoint): the job ended by itself, not a failure."""
    return all(code in (0, EXIT_PREEMPTED) for code in exit_codes.values())


@dataclass(frozen=True)
class Ending:
    """How the run's attempt loop ended a job (:mod:`multinode.app.watch`), for the backend to make its
    :class:`Outcome` of (its exit codes, and a scheduler's own account, are the backend's):

    * ``kind`` "" -- the job ended by itself (every part ended, or the batch job did);
    * ``kind`` "failed" | "lost" | "stalled" -- the loop stopped it for ``failure``; ``lost`` names the lost nodes;
    * ``stopped_by`` -- a stop signal to the orchestrator (the ranks were given the notice where GRACE is set);
      ``cancelled``: the notice did not end the job and it was stopped.
    """

    kind: str = ""
    failure: NodeError | None = None
    lost: tuple[str, ...] = ()
    stopped_by: int | None = None
    noticed: bool = False  # the signal was given to the ranks as a notice (GRACE)
    cancelled: bool = False
