"""The survivors' pause after a loss without warning: the run's look at the silent member (its ranks' stacks and an
SSH probe) starts with the first KEPT, on a thread, and answers as an event; the loop is never held by it, so the
provider's word that the machine is gone leaves the node at once. The recovery benchmark measured 6.5-7.6 s from the
loss to the new world in 3 runs of 9 (and 18.2 s once) while the window, the stacks (3 s channel timeout on the silent
node) and the probe (3 s) ran in turn on the loop. Fakes stand in for the job, members and recovery; the real path
runs in tests/integration/test_survivor_local.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from multinode.app import changes as changes_mod
from multinode.app.changes import Changes
from multinode.core.events import Events, JobRecord, Looked, NodeGone
from multinode.trainer import channel

NODES = ["node-0", "node-1", "node-2"]


class FakeRunner:
    def __init__(self) -> None:
        self.cut: list[list[str]] = []

    def cut_off(self, lost, survivors, spare_port=None, peers=None) -> None:
        self.cut.append(list(lost))


class FakeMembers:
    def __init__(self) -> None:
        self.names = list(NODES)
        self.formed = 0

    def usable(self, name):
        return None

    def leave(self, name) -> None:
        self.names.remove(name)


class FakeRecovery:
    def __init__(self) -> None:
        self.left: list[tuple[str, str, str]] = []

    def may_recover(self) -> bool:
        return True

    def left_in_process(self, name, kind, why, at, survivors) -> None:
        self.left.append((name, kind, why))


class FakeInventory:
    def only(self, names):
        return list(names)


@pytest.fixture
def probe(monkeypatch):
    """probe_ssh held until the test answers it: {node: (ok, why)} per call."""
    state = SimpleNamespace(asked=[], release=threading.Event(), answer={})

    def fake(inventory, timeout):
        state.asked.append((list(inventory), time.monotonic()))
        state.release.wait(10)
        return {name: state.answer.get(name, (False, "Timeout opening channel")) for name in inventory}

    monkeypatch.setattr(changes_mod, "probe_ssh", fake)
    return state


def _changes(window: float, monkeypatch) -> tuple[Changes, Events, FakeRunner, FakeRecovery]:
    monkeypatch.setattr(changes_mod, "KEPT_WINDOW", window)
    runner, recovery, events = FakeRunner(), FakeRecovery(), Events()
    ctx = SimpleNamespace(spec=SimpleNamespace(rdzv_port=29500, recover=1), runner=runner, inv=FakeInventory())
    job = SimpleNamespace(depart=lambda name: None, drop=lambda name: None)
    made = Changes(ctx, job, FakeMembers(), recovery, prepare=lambda name: None, say=lambda line: None,
                   last_seen={}, capture=None, events=events)
    return made, events, runner, recovery


def _kept(changes: Changes, pending: set[str], *nodes: str) -> None:
    for node in nodes:
        assert changes.take(JobRecord(node, channel.KEPT, {}), pending, None, (), {})


def test_the_look_starts_with_the_first_kept_and_its_answer_decides_after_the_window(probe, monkeypatch):
    changes, events, runner, recovery = _changes(0.5, monkeypatch)
    pending = set(NODES)
    began = time.monotonic()
    _kept(changes, pending, "node-0", "node-2")
    deadline = time.monotonic() + 5
    while not probe.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    # asked at node-0's KEPT, before any tick: every member silent then (node-2 paused a moment later)
    assert probe.asked and probe.asked[0][0] == ["node-1", "node-2"], probe.asked
    assert probe.asked[0][1] - began < changes_mod.KEPT_WINDOW
    changes.tick(pending)
    assert runner.cut == []  # no answer yet: nobody leaves
    probe.release.set()
    answer = events.take(5)
    assert isinstance(answer, Looked) and answer.silent == ("node-1", "node-2")
    time.sleep(max(0.0, began + 0.5 - time.monotonic()))
    assert changes.take(answer, pending, None, (), {})
    assert runner.cut == [["node-1"]] and "node-1" not in pending
    assert recovery.left == [("node-1", "lost", "it does not answer SSH while its peers paused "
                                                "(Timeout opening channel)")]


def test_the_providers_word_leaves_the_node_while_the_look_is_under_way(probe, monkeypatch):
    changes, events, runner, recovery = _changes(0.5, monkeypatch)
    pending = set(NODES)
    _kept(changes, pending, "node-0", "node-2")
    assert changes.take(NodeGone("node-1", "its namespace is gone"), pending, None, (), {})
    assert runner.cut == [["node-1"]], "the gone node waited on the look"
    assert recovery.left[0][:2] == ("node-1", "lost")
    probe.release.set()
    answer = events.take(5)
    time.sleep(0.5)
    assert changes.take(answer, pending, None, (), {})
    assert runner.cut == [["node-1"]] and len(recovery.left) == 1  # the late answer changes nothing


def test_a_member_that_answers_with_live_ranks_is_waited_for_and_a_stale_answer_is_ignored(probe, monkeypatch):
    changes, events, runner, recovery = _changes(0.0, monkeypatch)
    pending = set(NODES)
    probe.answer["node-1"] = (True, "up 3 hours")
    probe.release.set()
    assert changes.take(Looked(99, ("node-1",), {}, {"node-1": (False, "x")}), pending, None, (), {})
    _kept(changes, pending, "node-0", "node-2")
    assert changes.take(events.take(5), pending, None, (), {})
    assert runner.cut == [] and "node-1" in changes.alive and recovery.left == []


def test_after_a_notice_the_leaving_node_is_not_looked_at_unless_it_is_late(probe, monkeypatch):
    """A notice's survivors say ``why: leave`` in their KEPT: the noticed node exits 75 by itself, so no look (its
    ranks' stacks and an SSH probe) runs beside their re-form -- the recovery benchmark's notice row took 2.1-2.5 s
    with it, 1.1-1.9 s before the look started at the first KEPT. A noticed node still silent after the window is
    looked at as any other."""
    changes, events, runner, recovery = _changes(0.3, monkeypatch)
    pending = set(NODES)
    for node in ("node-0", "node-1"):
        assert changes.take(JobRecord(node, channel.KEPT, {"rank": 0, "host": node, "step": 5, "why": "leave"}),
                            pending, None, (), {})
    time.sleep(0.1)
    assert probe.asked == []
    pending.discard("node-2")  # it exited 75
    changes.tick(pending)
    assert probe.asked == [] and recovery.left == [("node-2", "notice", "its ranks left on a notice")]
    assert runner.cut == [[]]  # a notice's node is not cut off: it left

    late, events, runner, recovery = _changes(0.1, monkeypatch)
    pending = set(NODES)
    assert late.take(JobRecord("node-0", channel.KEPT, {"rank": 0, "host": "node-0", "step": 5, "why": "leave"}),
                     pending, None, (), {})
    time.sleep(0.15)
    late.tick(pending)
    deadline = time.monotonic() + 5
    while not probe.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.asked and probe.asked[0][0] == ["node-1", "node-2"]
    probe.release.set()
