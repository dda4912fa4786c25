"""How a job ends is one typed Outcome (multinode.core.outcome), made where the job is watched (the run's attempt
loop, multinode.app.watch, over the SSH job's parts) and never read back from a message's wording: each kind with
its exit code, a lost session, a stall and a node's own exit told apart by what happened. The job's node sessions
are stand-ins answering on threads (tests/unit/attempt_fakes.py); nothing is started."""

from __future__ import annotations

import signal
import threading

import pytest
from attempt_fakes import Sessions, loop

from multinode.app import watchers as watch
from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED, NodeError
from multinode.core.events import Stalled
from multinode.core.outcome import OUTCOMES, Outcome
from multinode.trainer.channel import EXIT_PEER_FAILED


def run(tmp_path, runner: Sessions, **options) -> Outcome:
    return loop(tmp_path, runner, **options).run()


def test_every_node_ending_0_succeeds_and_a_75_among_0s_is_preempted(tmp_path):
    assert run(tmp_path, Sessions({"node-0": 0, "node-1": 0})).kind == "succeeded"
    preempted = run(tmp_path, Sessions({"node-0": EXIT_PREEMPTED, "node-1": 0}))
    assert preempted.kind == "preempted" and preempted.exit_code == EXIT_PREEMPTED and preempted.stopped_by is None


def test_a_node_s_own_exit_fails_the_job_and_a_lost_session_loses_its_node(tmp_path):
    seen = []
    failed = run(tmp_path, Sessions({"node-0": 0, "node-1": 3}), capture=lambda f, lost: seen.append(lost))
    assert failed.kind == "failed" and failed.failure.node == "node-1" and failed.failure.returncode == 3
    assert failed.exit_code == 1 and failed.lost == () and seen == [()]
    lost = run(tmp_path, Sessions({"node-0": 0, "node-1": "lost"}), capture=lambda f, lost: seen.append(lost))
    assert lost.kind == "lost" and lost.lost == ("node-1",) and lost.failure.node == "node-1"
    assert seen[-1] == ("node-1",)  # the look at the live ranks skips it


def test_a_node_killed_whose_machine_then_stops_answering_is_lost_not_a_failure_of_the_job_s_own(tmp_path):
    """A machine lost at once SIGKILLs its processes and only then takes its network: the exit (137) arrives over
    SSH before the provider says "gone". The node's silence to the stop names it lost (a recovering run replaces it,
    after its own probes); a node killed that answers the stop stays a failure (issue 48: the CI's noticed node that
    died during the checkpoint ended the run as its own failure)."""
    silent = run(tmp_path, Sessions({"node-0": 1, "node-1": 137, "node-2": 1}, silent=("node-1",)))
    assert silent.kind == "failed" and silent.lost == ("node-1",) and silent.failure.returncode is not None
    answers = run(tmp_path, Sessions({"node-0": 0, "node-1": 137}))
    assert answers.kind == "failed" and answers.lost == ()


def test_a_node_whose_machine_is_gone_is_lost_while_its_session_still_waits(tmp_path, monkeypatch):
    """A vanished machine ends no SSH session: the loop asks the provider every GONE_POLL seconds; the gone node is
    lost, its connection dropped, the survivors' links to it cut before the stop, and the stop skips it."""
    monkeypatch.setattr(watch, "GONE_POLL", 0.05)
    runner = Sessions({"node-0": 0, "node-1": 0, "node-2": 0}, release=threading.Event())  # nobody ends by itself
    gone = lambda names: {"node-2": "its instance is terminated"} if "node-2" in names else {}  # noqa: E731
    spec = LaunchSpec(nodes=3, run_id="r1", deadline=30)  # without the poll: the deadline's failure, 30 s on
    lost = run(tmp_path, runner, spec=spec, gone=gone)
    assert lost.kind == "lost" and lost.lost == ("node-2",) and lost.failure.node == "node-2"
    assert lost.failure.message == "is gone (its instance is terminated)" and "node-2" in runner.dropped
    assert (runner.cut[0], sorted(runner.cut[1])) == (["node-2"], ["node-0", "node-1"]) and runner.stops == ["r1"]
    assert lost.why_lost == {"node-2": "is gone (its instance is terminated)"}


def test_a_stall_is_its_own_kind_and_stops_every_node(tmp_path):
    runner = Sessions({"node-0": 0, "node-1": 0}, release=threading.Event())
    attempt = loop(tmp_path, runner)
    attempt.events.put(Stalled("no progress for 15 s"))  # what the watchdog puts on the attempt's queue
    stalled = attempt.run()
    assert stalled.kind == "stalled" and stalled.failure.message.startswith("no progress for 15 s")
    assert runner.stops == ["r1"] and stalled.exit_code == 1


def test_only_collectives_failed_when_the_first_failure_is_a_peer_s_and_nobody_failed_their_own_way(tmp_path):
    """A node's ranks exit EXIT_PEER_FAILED (76) when their collective failed with nothing of their own wrong: a
    recovering run starts every process again only where the first node to fail said so, none was lost, and the
    others ended well, the same way or by the run's stop (143; 137 where a rank outlived its grace)."""
    slow = run(tmp_path, Sessions({"node-0": 0, "node-1": EXIT_PEER_FAILED}))
    assert slow.kind == "failed" and slow.failure.node == "node-1" and slow.peers_failed
    for codes in ({"node-0": 143, "node-1": 76, "node-2": 76, "node-3": 137}, {"node-0": None, "node-1": 76}):
        first = next(name for name, code in codes.items() if code == EXIT_PEER_FAILED)
        made = Outcome("failed", codes, failure=NodeError(first, "job", EXIT_PEER_FAILED, "exited with code 76"))
        assert made.peers_failed, codes
    own = Outcome("failed", {"node-0": 76, "node-1": 1}, failure=NodeError("node-0", "job", 76, "exited"))
    assert not own.peers_failed  # a rank's own failure beside it: the job's bug, not retried
    killed_first = Outcome("failed", {"node-0": 76, "node-1": 137}, failure=NodeError("node-1", "job", 137, "killed"))
    assert not killed_first.peers_failed  # the first to fail was killed (an OOM): not the collectives alone
    lost = run(tmp_path, Sessions({"node-0": EXIT_PEER_FAILED, "node-1": "lost"}))
    assert lost.lost == ("node-1",) and not lost.peers_failed, lost  # a lost node: recovery's other branch


def test_exit_codes_follow_the_kind_and_an_interruption_its_signal():
    stop = NodeError("node-0", "job", None, "stopped by SIGTERM; run r1 was stopped on every node")
    assert Outcome.interrupted(signal.SIGTERM, stop.message, "node-0", {}).exit_code == 143
    assert Outcome.interrupted(signal.SIGHUP, stop.message, "node-0", {}).exit_code == 129
    assert Outcome.ended({"node-0": 0}).exit_code == 0
    with pytest.raises(ValueError, match="names its failure"):
        Outcome("failed", {"node-0": 1})
    assert set(OUTCOMES) == {"succeeded", "preempted", "failed", "lost", "stalled", "interrupted"}
