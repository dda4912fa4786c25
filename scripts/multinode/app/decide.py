"""What a recovering run does after an attempt ends: a pure function of how it ended and what came before.

    decide(Ended, History) -> Decision(end | replace | shrink | grow back | restart, nodes, why)

* **end** -- the job succeeded; the orchestrator was stopped (interrupted, or preempted by its own signal: the user
  asked, nothing to recover); a failure with no node lost (the job's own: recovery does not retry bugs) unless
  only its collectives failed; RECOVER spent; no node left to go on with;
* **restart** -- only the job's collectives failed, every node answering (a node's ranks exited
  ``EXIT_PEER_FAILED``, none in a way of its own: a peer slower than the process-group timeout -- a throttled
  CPU, a rank frozen for a while -- or the network between them): every process started again on the same nodes,
  from the freshest snapshot (the survivors' last step where they wrote it), as torchrun's restarts would;
* **grow back** -- the attempt's own grow-back notice ended it (every missing node was back): the next attempt
  runs on the whole cluster, from the checkpoint the notice wrote (or the freshest snapshot, if the notice met
  the job where it takes none);
* **replace** -- a notice's node(s) (the ranks kept one coordinated checkpoint) or the lost node(s): each replaced,
  recovery waiting at most ``wait`` seconds for it (``wait_seconds``: RECOVER_WAIT, or 0 when the provider says
  the replacement takes longer than a restart), the run going on without a node not ready by then -- **shrink**
  when ``wait`` is 0: going on without them at once while their replacements are made, growing back later.

Everything it needs is in :class:`Ended` -- the outcome's kind and signal, the nodes lost (confirmed by the attempt
loop) and the notice's node: nothing is probed or parsed here. The executor is :mod:`multinode.app.recover`;
the table of cases is tests/unit/test_decide.py.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS = ("end", "replace", "shrink", "grow back", "restart")


@dataclass(frozen=True)
class Ended:
    """How an attempt ended, as recovery reads it."""

    kind: str  # multinode.core.outcome.OUTCOMES
    stopped_by: str | None = None  # a stop signal to the orchestrator
    lost: tuple[str, ...] = ()  # nodes lost (no SSH, gone), confirmed
    noticed: tuple[str, ...] = ()  # the node(s) a notice named (rank 0's PREEMPTED report, and the batch's others)
    grew: bool = False  # the attempt's own grow-back notice ended it
    peers_failed: bool = False  # only its collectives failed (Outcome.peers_failed)


@dataclass(frozen=True)
class History:
    """What the run has been through."""

    recoveries: int  # recoveries so far
    budget: int  # RECOVER
    nodes: int  # nodes of the attempt that ended
    wait: float  # seconds recovery would wait for a replacement (wait_seconds)


@dataclass(frozen=True)
class Decision:
    action: str  # one of ACTIONS
    nodes: tuple[str, ...] = ()  # the nodes to replace
    cause: str = ""  # "notice" | "lost" | "grow" | "collective"
    why: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown recovery action {self.action!r}; one of {', '.join(ACTIONS)}")


def decide(ended: Ended, history: History) -> Decision:
    """The next step of a recovering run (module doc). Pure."""
    if ended.grew:
        return Decision("grow back", cause="grow", why="the grow-back notice ended the attempt: every node is back")
    if ended.kind == "succeeded":
        return Decision("end", why="the job succeeded")
    if ended.stopped_by is not None or ended.kind == "interrupted":
        return Decision("end", why=f"the orchestrator was stopped ({ended.stopped_by}): nothing to recover")
    if ended.kind == "preempted":
        nodes = ended.noticed + tuple(n for n in ended.lost if n not in ended.noticed)
        cause = "notice"
    elif ended.lost:
        nodes, cause = ended.lost, "lost"
    elif ended.peers_failed:
        nodes, cause = (), "collective"
    else:
        return Decision("end", why=f"the job {ended.kind} with every node answering: its own failure, not retried")
    if history.recoveries >= history.budget:
        return Decision("end", nodes, cause, f"RECOVER={history.budget} recoveries spent")
    if cause == "collective":
        return Decision("restart", cause=cause, why="a collective failed with every node answering (a peer slower "
                                                    "than the process-group timeout, or the network between them)")
    if not nodes:
        return Decision("end", why="a notice that names no node of the attempt")
    action = "replace" if history.wait > 0 else "shrink"
    return Decision(action, nodes, cause, f"{', '.join(nodes)}: "
                                          f"{'got a notice' if cause == 'notice' else 'lost'}")
