"""The recovery decision (multinode.app.decide.decide) as a table: how an attempt ended and what came before, in;
what the run does next, out. Pure: nothing is probed, parsed or replaced."""

from __future__ import annotations

import pytest

from multinode.app.decide import Decision, Ended, History, decide

FRESH = History(recoveries=0, budget=2, nodes=3, wait=120.0)
SPENT = History(recoveries=2, budget=2, nodes=3, wait=120.0)
SLOW = History(recoveries=0, budget=2, nodes=3, wait=0.0)  # the replacement takes longer than a restart


@pytest.mark.parametrize("ended, history, action, nodes, cause", [
    (Ended("succeeded"), FRESH, "end", (), ""),
    (Ended("interrupted", stopped_by="SIGINT"), FRESH, "end", (), ""),
    (Ended("preempted", stopped_by="SIGTERM", noticed=("node-1",)), FRESH, "end", (), ""),  # the user stopped it
    (Ended("failed"), FRESH, "end", (), ""),  # every node answers: the job's own failure
    (Ended("failed", peers_failed=True), FRESH, "restart", (), "collective"),  # only its collectives failed
    (Ended("failed", peers_failed=True), SLOW, "restart", (), "collective"),  # the same nodes: nothing to replace
    (Ended("failed", peers_failed=True), SPENT, "end", (), "collective"),
    (Ended("stalled"), FRESH, "end", (), ""),
    (Ended("lost", lost=("node-2",)), FRESH, "replace", ("node-2",), "lost"),
    (Ended("stalled", lost=("node-2",)), FRESH, "replace", ("node-2",), "lost"),
    (Ended("lost", lost=("node-0", "node-2")), FRESH, "replace", ("node-0", "node-2"), "lost"),
    (Ended("lost", lost=("node-2",)), SLOW, "shrink", ("node-2",), "lost"),
    (Ended("preempted", noticed=("node-1",)), FRESH, "replace", ("node-1",), "notice"),
    (Ended("preempted", noticed=("node-1",), lost=("node-2",)), FRESH, "replace", ("node-1", "node-2"), "notice"),
    (Ended("preempted", noticed=("node-1",)), SLOW, "shrink", ("node-1",), "notice"),
    (Ended("preempted"), FRESH, "end", (), ""),  # a notice naming no node of the attempt
    (Ended("lost", lost=("node-2",)), SPENT, "end", ("node-2",), "lost"),
    (Ended("preempted", noticed=("node-1",)), SPENT, "end", ("node-1",), "notice"),
    (Ended("preempted", grew=True), SPENT, "grow back", (), "grow"),  # growing back is no recovery
    (Ended("failed", grew=True), FRESH, "grow back", (), "grow"),  # the notice met the job at its exit
])
def test_the_decision_table(ended, history, action, nodes, cause):
    decision = decide(ended, history)
    assert (decision.action, decision.nodes, decision.cause) == (action, nodes, cause), decision.why
    assert decision.why  # every decision says why, in words


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="unknown recovery action 'retry'"):
        Decision("retry")
