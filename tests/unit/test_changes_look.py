"""The survivors' pause after a loss without warning: with the first KEPT the run asks, on a thread, which silent
member takes no TCP connection -- that one leaves at once; after the window its look at the others (their ranks'
stacks and an SSH probe) answers as an event. The loop is never held by either, so the provider's word that the
machine is gone leaves the node at once too. The recovery benchmark measured 6.5-7.6 s from the loss to the new world
in 3 runs of 9 (and 18.2 s once) while the window, the stacks (3 s channel timeout on the silent node) and the probe
(3 s) ran in turn on the loop. Fakes stand in for the job, members and recovery; the real path
runs in tests/integration/test_survivor_local.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from multinode.app import changes as changes_mod
from multinode.app import look as look_mod
from multinode.app.changes import Changes
from multinode.core.events import (Events, JobRecord, Looked, NodeEnded, NodeGone, ReplacementReady, ReplacementRefused,
                                   Unreachable)
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
        self.formed = self.generation = 0
        self.pending: dict = {}
        self.supported = True
        self.again_written: list[list[str]] = []

    def usable(self, name):
        return None

    def leave(self, name, first=lambda: None, told=False) -> None:
        self.names.remove(name)
        self.generation += 1
        first()

    def again(self) -> None:
        self.generation += 1
        self.again_written.append(list(self.names))


class FakeRecovery:
    def __init__(self) -> None:
        self.left: list[tuple[str, str, str]] = []
        self.reformed_why: list[str] = []
        self.worlds: list[int] = []
        self.budget = 1

    def may_recover(self) -> bool:
        return len(self.left) + len(self.reformed_why) < self.budget

    def reformed(self, why, at, nodes) -> None:
        self.reformed_why.append(why)

    def world_changed(self, world, at) -> None:
        self.worlds.append(world["generation"])

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

    monkeypatch.setattr(look_mod, "probe_ssh", fake)
    return state


def _changes(window: float, monkeypatch) -> tuple[Changes, Events, FakeRunner, FakeRecovery]:
    monkeypatch.setattr(changes_mod, "KEPT_WINDOW", window)
    runner, recovery, events = FakeRunner(), FakeRecovery(), Events()
    ctx = SimpleNamespace(spec=SimpleNamespace(rdzv_port=29500, recover=1, pg_timeout=30), runner=runner,
                          inv=FakeInventory())
    job = SimpleNamespace(depart=lambda name: None, drop=lambda name: None)
    made = Changes(ctx, job, FakeMembers(), recovery, prepare=lambda name: None, say=lambda line: None,
                   last_seen={}, capture=None, events=events)
    return made, events, runner, recovery


def _kept(changes: Changes, pending: set[str], *nodes: str) -> None:
    for node in nodes:
        assert changes.take(JobRecord(node, channel.KEPT, {}), pending, None, (), {})


@pytest.fixture
def reach(monkeypatch):
    """reach_tcp answering ``cut`` ({node: why}) for the silent members it is asked about."""
    state = SimpleNamespace(asked=[], cut={})

    def fake(inventory, timeout):
        state.asked.append((list(inventory), time.monotonic()))
        return {name: why for name, why in state.cut.items() if name in inventory}

    monkeypatch.setattr(look_mod, "reach_tcp", fake)
    return state


def test_a_silent_member_no_tcp_connection_reaches_leaves_before_the_window(reach, probe, monkeypatch):
    """The first KEPT asks which silent members take a TCP connection; node-2 takes none (its link cut): it leaves
    as soon as that answer comes, the window (here 30 s) not waited for, no stack or SSH probe asked."""
    changes, events, runner, recovery = _changes(30.0, monkeypatch)
    pending = set(NODES)
    reach.cut["node-2"] = "no TCP connection to 10.0.0.12:22 within 1 s (timed out)"
    _kept(changes, pending, "node-0")
    answer = events.take(5)
    assert isinstance(answer, Unreachable) and reach.asked[0][0] == ["node-1", "node-2"]
    assert changes.take(answer, pending, None, (), {})
    assert runner.cut == [["node-2"]] and "node-2" not in pending
    assert recovery.left == [("node-2", "lost", "its SSH port takes no connection while its peers paused "
                                                "(no TCP connection to 10.0.0.12:22 within 1 s (timed out))")]
    _kept(changes, pending, "node-1")  # the other survivor pauses: the change is settled at the next tick
    changes.tick(pending)
    assert probe.asked == [] and changes.kept == {} and len(reach.asked) == 1


def test_after_the_window_the_look_decides_for_a_silent_member_that_takes_a_connection(reach, probe, monkeypatch):
    """node-1 takes a TCP connection but sends no KEPT: after the window, its ranks' stacks and an SSH probe; it does
    not answer SSH, so it leaves."""
    changes, events, runner, recovery = _changes(0.3, monkeypatch)
    pending = set(NODES)
    _kept(changes, pending, "node-0", "node-2")
    assert changes.take(events.take(5), pending, None, (), {})  # nobody unreachable
    assert runner.cut == [] and probe.asked == []
    time.sleep(0.35)
    changes.tick(pending)
    deadline = time.monotonic() + 5
    while not probe.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.asked and probe.asked[0][0] == ["node-1"], probe.asked
    changes.tick(pending)
    assert runner.cut == []  # no answer yet: nobody leaves
    probe.release.set()
    answer = events.take(5)
    assert isinstance(answer, Looked) and answer.silent == ("node-1",)
    assert changes.take(answer, pending, None, (), {})
    assert runner.cut == [["node-1"]] and "node-1" not in pending
    assert recovery.left == [("node-1", "lost", "it does not answer SSH while its peers paused "
                                                "(Timeout opening channel)")]


def test_the_providers_word_leaves_the_node_while_the_look_is_under_way(reach, probe, monkeypatch):
    changes, events, runner, recovery = _changes(0.0, monkeypatch)
    pending = set(NODES)
    _kept(changes, pending, "node-0", "node-2")
    assert changes.take(events.take(5), pending, None, (), {})  # the reach: node-1 takes a connection
    changes.tick(pending)  # the window (0 s) is over: the look starts, held by the probe
    assert changes.take(NodeGone("node-1", "its namespace is gone"), pending, None, (), {})
    assert runner.cut == [["node-1"]], "the gone node waited on the look"
    assert recovery.left[0][:2] == ("node-1", "lost")
    probe.release.set()
    answer = events.take(5)
    assert changes.take(answer, pending, None, (), {})
    assert runner.cut == [["node-1"]] and len(recovery.left) == 1  # the late answer changes nothing


def test_a_member_that_answers_with_live_ranks_is_waited_for_and_a_stale_answer_is_ignored(reach, probe, monkeypatch):
    changes, events, runner, recovery = _changes(0.0, monkeypatch)
    pending = set(NODES)
    probe.answer["node-1"] = (True, "up 3 hours")
    probe.release.set()
    assert changes.take(Looked(99, ("node-1",), {}, {"node-1": (False, "x")}), pending, None, (), {})
    assert changes.take(Unreachable(98, {"node-1": "x"}), pending, None, (), {})
    _kept(changes, pending, "node-0", "node-2")
    assert changes.take(events.take(5), pending, None, (), {})  # the reach
    changes.tick(pending)
    assert changes.take(events.take(5), pending, None, (), {})  # the look
    assert runner.cut == [] and "node-1" in changes.alive and recovery.left == []


def test_after_a_notice_the_leaving_node_is_not_looked_at_unless_it_is_late(reach, probe, monkeypatch):
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
    assert probe.asked == [] and reach.asked == []
    pending.discard("node-2")  # it exited 75
    changes.tick(pending)
    assert probe.asked == [] and reach.asked == []
    assert recovery.left == [("node-2", "notice", "its ranks left on a notice")]
    assert runner.cut == []  # a notice cuts nothing: no rank is in a collective (its SSH round delayed the write)

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


def test_the_old_session_of_a_node_that_left_ends_after_its_replacement_is_back_and_changes_nothing(reach, probe,
                                                                                                    monkeypatch):
    """node-2 leaves on the TCP reach (its session still open), its replacement is ready at once (a local node), and
    only then does the old session end: that end is the old part's, not a failure of the job (the recovery
    benchmark's loss row once ended the attempt on it and restarted every process)."""
    changes, events, runner, recovery = _changes(30.0, monkeypatch)
    recovery.timeline = SimpleNamespace(add=lambda *args, **kwargs: None)
    pending = set(NODES)
    reach.cut["node-2"] = "no TCP connection to 10.0.0.12:22 within 1 s (No route to host)"
    _kept(changes, pending, "node-0", "node-1")
    assert changes.take(events.take(5), pending, None, (), {})
    assert runner.cut == [["node-2"]] and "node-2" not in changes.members.names
    ready = ReplacementReady("node-2", SimpleNamespace(first=lambda n: None), time.time())
    assert changes.take(ready, pending, None, (), {}) and "node-2" not in changes.joins.leaving
    assert changes.take(NodeEnded("node-2", None, lost=True), pending, None, (), {})
    assert len(recovery.left) == 1


def test_a_refused_replacement_of_a_node_that_left_is_said_and_asked_again(reach, probe, monkeypatch):
    """A replacement refused while the survivors go on (no capacity, or its own error) was taken by nobody: the
    attempt loop handed it to growing back, which knows only the nodes missing when the attempt began -- the run
    ended a node short with nothing said (test_survivors_local, 4 runs of 11). Now it is on the timeline, said (once
    per node, as growing back says it), and asked again once RECOVER_WAIT has passed."""
    changes, events, runner, recovery = _changes(30.0, monkeypatch)
    added, said, asked = [], [], []
    recovery.timeline = SimpleNamespace(add=lambda *args, **kwargs: added.append(args))
    recovery.replacements = SimpleNamespace(ask=asked.append)
    changes.joins.say = said.append
    changes.ctx.spec.recover_wait = 0.2
    pending = set(NODES)
    assert not changes.take(ReplacementRefused("node-2", "no capacity"), pending, None, (), {})  # not one that left
    assert changes.take(NodeGone("node-2", "its network namespace is gone"), pending, None, (), {})
    assert changes.take(ReplacementRefused("node-2", "no capacity"), pending, None, (), {})
    assert added[-1] == ("replacement refused", "node-2: no capacity")
    assert said[-1].startswith("node-2: no replacement (no capacity); the job goes on without it")
    changes.tick(pending)
    assert asked == []
    deadline = time.monotonic() + 5
    while not asked and time.monotonic() < deadline:
        time.sleep(0.05)
        changes.tick(pending)
    assert asked == ["node-2"] and "node-2" in changes.joins.leaving
    told = (len(added), len(said))  # refused again (a shortage lasts minutes): asked again, said once per node
    assert changes.take(ReplacementRefused("node-2", "no capacity"), pending, None, (), {})
    assert (len(added), len(said)) == told and "node-2" in changes.joins.refused


def test_a_rank_whose_step_waits_has_the_others_reached_and_one_no_connection_reaches_leaves(reach, probe,
                                                                                           monkeypatch):
    """node-0's rank says WAITING (its step far past its typical time; node-2's link cut, no KEPT from anyone yet:
    the collective would wait for the process-group timeout): the other members are reached at once; node-2 takes
    no connection and leaves, cut off, before any survivor has paused. A second WAITING while that reach is under
    way asks nothing more; an answer that reaches everyone changes nothing."""
    changes, events, runner, recovery = _changes(30.0, monkeypatch)
    pending = set(NODES)
    waiting = JobRecord("node-0", channel.WAITING, {"rank": 0, "step": 41, "seconds": 0.6})
    assert changes.take(waiting, pending, None, (), {})
    assert changes.take(JobRecord("node-1", channel.WAITING, {"rank": 1, "step": 41}), pending, None, (), {})
    answer = events.take(5)
    assert isinstance(answer, Unreachable) and [asked for asked, _ in reach.asked] == [["node-1", "node-2"]]
    assert changes.take(answer, pending, None, (), {}) and runner.cut == [] and recovery.left == []
    reach.cut["node-2"] = "no TCP connection to 10.0.0.12:22 within 1 s (timed out)"
    assert changes.take(waiting, pending, None, (), {})
    assert changes.take(events.take(5), pending, None, (), {})
    assert runner.cut == [["node-2"]] and "node-2" not in pending and probe.asked == []
    assert recovery.left == [("node-2", "lost", "its SSH port takes no connection while a peer's step waits "
                                                "(no TCP connection to 10.0.0.12:22 within 1 s (timed out))")]


def test_every_member_paused_with_none_gone_forms_the_job_again_with_the_same_members(reach, probe, monkeypatch):
    """A peer slower than the process-group timeout (a throttled CPU; the spot day's head held to 0.03 of a core):
    the others' collective times out and they pause; the slow one answers with live ranks, is waited for, and pauses
    when its own collective fails. Every member paused and none left: the same members form the next generation
    (once), a recovery that names the last to pause -- before, nothing was written, every rank waited out the reform
    timeout and the run ended failed with no node lost."""
    changes, events, runner, recovery = _changes(0.0, monkeypatch)
    pending = set(NODES)
    probe.answer["node-0"] = (True, "up 3 hours")
    probe.release.set()
    _kept(changes, pending, "node-1", "node-2")
    assert changes.take(events.take(5), pending, None, (), {})  # the reach: node-0 takes a connection
    changes.tick(pending)
    assert changes.take(events.take(5), pending, None, (), {})  # the look: node-0's ranks live, waited for
    assert "node-0" in changes.alive and changes.members.again_written == [] and recovery.left == []
    time.sleep(0.01)
    _kept(changes, pending, "node-0")  # its collective failed too: every member paused
    assert changes.members.again_written == [NODES] and runner.cut == []
    assert recovery.reformed_why == ["every node's ranks paused with none gone (node-0 last: a collective failed, a "
                                     "peer slower than PG_TIMEOUT=30 s or the network between them)"]
    _kept(changes, pending, "node-1")  # a late record of the same pause: nothing more
    assert len(changes.members.again_written) == 1
    changes.take(JobRecord("node-0", channel.WORLD, {"generation": 1, "world_size": 3, "before": 3}), pending, None,
                 (), {})  # the new world trains: the next pause is a new one
    assert changes.paused == {} and changes.members.formed == 1 and recovery.worlds == [1]


def test_no_new_generation_where_a_node_left_or_recover_is_spent(reach, probe, monkeypatch):
    """A node lost in the change: its leave wrote the survivors' generation, the others' pauses ask nothing more;
    RECOVER spent: nothing written (the ranks wait out the reform timeout; the restart path's decision ends it)."""
    changes, events, runner, recovery = _changes(30.0, monkeypatch)
    recovery.budget = 2
    pending = set(NODES)
    reach.cut["node-2"] = "no TCP connection"
    _kept(changes, pending, "node-0")
    assert changes.take(events.take(5), pending, None, (), {})  # node-2 leaves
    _kept(changes, pending, "node-1")
    assert changes.members.again_written == [] and recovery.reformed_why == []

    spent, events, runner, recovery = _changes(0.0, monkeypatch)
    recovery.budget = 0
    _kept(spent, set(NODES), *NODES)
    assert spent.members.again_written == [] and recovery.reformed_why == []
