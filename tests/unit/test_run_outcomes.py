"""How a job ends is one typed Outcome (multinode.core.outcome), made where the job is watched
(multinode.ssh.job.JobRun) and never read back from a message's wording: each kind with its exit code, a lost
session, a stall and a node's own exit told apart by what happened. The job's node sessions are stand-ins
answering on threads; nothing is started."""

from __future__ import annotations

import io
import signal
import threading

import pytest

from multinode.core.errors import EXIT_PREEMPTED, NodeError
from multinode.core.outcome import OUTCOMES, Outcome
from multinode.ssh import job as jobmod
from multinode.ssh.runner import StopPolicy


class Sessions:
    """A runner whose node sessions end as ``ends[node]`` says: an exit code, or ``"lost"`` (the SSH session
    raises), once ``release`` is set (or at once); every stop ends the sessions still open with 143."""

    def __init__(self, ends: dict[str, object], release: threading.Event | None = None):
        self.ends, self.release = ends, release or threading.Event()
        self.stop, self.stops, self.said = StopPolicy(), [], []
        self.print_lock, self.out = threading.Lock(), io.StringIO()
        self.stopped = threading.Event()
        if release is None:
            self.release.set()

    def say(self, message):
        self.said.append(message)

    def execute(self, name, command, timeout=None, out=None, err=None):
        while not (self.release.is_set() or self.stopped.is_set()):
            self.release.wait(0.05)
        end = self.ends[name] if not self.stopped.is_set() or self.release.is_set() else 143
        if end == "lost":
            raise EOFError("the session closed")
        return end, b"", b""

    def stop_all(self, run_id, extra_stop=None, names=None):
        self.stops.append(run_id)
        self.stopped.set()
        return {name: type("Answer", (), {"exit_code": 0, "ok": True, "stdout": "stopped 1"})() for name in self.ends}

    def drop(self, name):
        pass

    gone: dict = {}

    def vanished(self, names=None):
        return {}  # the provider knows of no machine gone

    def cut_off(self, lost, names):
        self.cut = (list(lost), list(names))


def run(tmp_path, runner, **options) -> Outcome:
    return jobmod.JobRun(runner, {name: "true" for name in runner.ends}, run_id="r1", log_dir=tmp_path,
                         **options).run()


def test_every_node_ending_0_succeeds_and_a_75_among_0s_is_preempted(tmp_path):
    assert run(tmp_path, Sessions({"node-0": 0, "node-1": 0})).kind == "succeeded"
    preempted = run(tmp_path, Sessions({"node-0": EXIT_PREEMPTED, "node-1": 0}))
    assert preempted.kind == "preempted" and preempted.exit_code == EXIT_PREEMPTED and preempted.stopped_by is None


def test_a_node_s_own_exit_fails_the_job_and_a_lost_session_loses_its_node(tmp_path):
    seen = []
    failed = run(tmp_path, Sessions({"node-0": 0, "node-1": 3}), before_stop=lambda f, lost: seen.append(lost))
    assert failed.kind == "failed" and failed.failure.node == "node-1" and failed.failure.returncode == 3
    assert failed.exit_code == 1 and failed.lost == () and seen == [()]
    lost = run(tmp_path, Sessions({"node-0": 0, "node-1": "lost"}), before_stop=lambda f, lost: seen.append(lost))
    assert lost.kind == "lost" and lost.lost == ("node-1",) and lost.failure.node == "node-1"
    assert seen[-1] == ("node-1",)  # the look at the live ranks skips it


def test_a_node_whose_machine_is_gone_is_lost_while_its_session_still_waits(tmp_path, monkeypatch):
    """A vanished machine ends no SSH session: the job asks the runner (the provider) every GONE_POLL seconds; the
    gone node is lost, its connection dropped, the survivors' links to it cut before the stop."""
    monkeypatch.setattr(jobmod, "GONE_POLL", 0.05)
    runner = Sessions({"node-0": 0, "node-1": 0, "node-2": 0}, release=threading.Event())  # nobody ends by itself
    runner.vanished = lambda names=None: {"node-2": "its instance is terminated"} if "node-2" in names else {}
    dropped = []
    runner.drop = dropped.append
    lost = run(tmp_path, runner, deadline=30)  # without the poll: the deadline's failure, 30 s on
    assert lost.kind == "lost" and lost.lost == ("node-2",) and lost.failure.node == "node-2"
    assert lost.failure.message == "is gone (its instance is terminated)" and "node-2" in dropped
    assert (runner.cut[0], sorted(runner.cut[1])) == (["node-2"], ["node-0", "node-1"]) and runner.stops == ["r1"]


def test_a_stall_is_its_own_kind_and_stops_every_node(tmp_path):
    runner = Sessions({"node-0": 0, "node-1": 0}, release=threading.Event())
    stalled = run(tmp_path, runner, stalled=lambda: "no progress for 15 s")
    assert stalled.kind == "stalled" and stalled.failure.message.startswith("no progress for 15 s")
    assert runner.stops == ["r1"] and stalled.exit_code == 1


def test_exit_codes_follow_the_kind_and_an_interruption_its_signal():
    stop = NodeError("node-0", "job", None, "stopped by SIGTERM; run r1 was stopped on every node")
    assert Outcome.interrupted(signal.SIGTERM, stop.message, "node-0", {}).exit_code == 143
    assert Outcome.interrupted(signal.SIGHUP, stop.message, "node-0", {}).exit_code == 129
    assert Outcome.ended({"node-0": 0}).exit_code == 0
    with pytest.raises(ValueError, match="names its failure"):
        Outcome("failed", {"node-0": 1})
    assert set(OUTCOMES) == {"succeeded", "preempted", "failed", "lost", "stalled", "interrupted"}
