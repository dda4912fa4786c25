"""A noticed node that trains on until its replacement is ready: the ranks' agreement (they say NOTICE and go on, and
leave when the run writes a membership without them or at the notice's action time less STAY_MARGIN), the
replacement launched beside the node (its provider's call back waits for the run), and the run's decisions on
NOTICE and Retire. Pure: fakes for the run's parts, threads only where the replacement runs on one; the real job on
real nodes runs in tests/integration/test_stay_local.py."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout
from types import SimpleNamespace

import pytest

from multinode.app.replacements import Replacements
from multinode.app.stays import Stays
from multinode.core.events import Events, JobRecord, NodeEnded, ReplacementReady, Retire
from multinode.trainer import channel
from training import imds, notice


def _at(seconds_from_now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds_from_now))


class Written:
    """The newest membership generation written on this rank's node (what ``Members.newest`` reads)."""

    def __init__(self) -> None:
        self.generation = 0

    def __call__(self) -> int:
        return self.generation


def _agreement(rank: int = 1, grace: float | None = None) -> tuple[notice.Agreement, notice.Watcher, Written]:
    """Rank ``rank`` of 2 whose collective sees only its own values (the other rank contributes zeros)."""
    watcher, written = notice.Watcher(None, grace), Written()
    return notice.Agreement(watcher, lambda values: values, notice.Members(rank, 2, written)), watcher, written


def _decide(agreement: notice.Agreement, steps: int = 3000) -> str | None:
    """The agreement's first decision within ``steps`` steps (None: the ranks trained on)."""
    for _ in range(steps):
        decision = agreement.check()
        if decision is not None:
            return decision
    return None


def test_an_interruption_notice_lets_the_ranks_train_on_and_says_notice_once():
    agreement, watcher, _ = _agreement()
    watcher.note(imds.Notice("interruption", "terminate", _at(120)))
    out = io.StringIO()
    with redirect_stdout(out):
        assert _decide(agreement) is None
        assert _decide(agreement) is None
    records = channel.every(out.getvalue().splitlines(), channel.NOTICE)
    assert len(records) == 1 and records[0]["rank"] == 1
    assert abs(records[0]["leave_by"] - (imds.Notice("interruption", "terminate", records[0]["time"]).epoch()
                                         - notice.STAY_MARGIN)) < 1e-6


def test_a_membership_without_the_node_is_a_reform_and_the_deadline_a_leave():
    agreement, watcher, written = _agreement()
    watcher.note(imds.Notice("interruption", "terminate", _at(120)))
    with redirect_stdout(io.StringIO()):
        assert _decide(agreement) is None
        written.generation = 1  # the run let the node go: its ranks change at their next check (and find no place)
        assert _decide(agreement) == "reform" and agreement.generation == 1

    late, watcher, _ = _agreement()
    watcher.note(imds.Notice("interruption", "terminate", _at(notice.STAY_MARGIN - 5)))  # past its leave-by
    assert _decide(late) == "leave" and late.leaving == [1]


def test_a_noticed_head_stays_too_and_stops_every_rank_at_its_deadline():
    head, watcher, _ = _agreement(rank=0)
    watcher.note(imds.Notice("interruption", "terminate", _at(120)))
    with redirect_stdout(io.StringIO()):
        assert _decide(head) is None
    watcher.notice = imds.Notice("interruption", "terminate", _at(notice.STAY_MARGIN - 1))  # its deadline came
    assert _decide(head) == "stop"  # rank 0 holds the job's store: every rank stops (the coordinated checkpoint)


def test_a_signal_or_a_job_without_members_stops_at_once():
    agreement, watcher, _ = _agreement(grace=30.0)
    watcher._on_signal(15, None)
    assert _decide(agreement) == "leave"
    alone = notice.Agreement(notice.Watcher(None, grace=30.0), lambda values: values)
    alone.watcher.note(imds.Notice("interruption", "terminate", _at(120)))
    assert _decide(alone) == "stop"


def test_a_sigterm_after_the_notice_ends_the_stay():
    """A user script behind training.guard: the guard passes the same notice on as SIGTERM, then SIGKILLs after the
    grace -- a rank that stayed on its own reading of the notice leaves at the signal instead of being killed."""
    agreement, watcher, _ = _agreement(grace=30.0)
    watcher.note(imds.Notice("interruption", "terminate", _at(120)))
    with redirect_stdout(io.StringIO()):
        assert _decide(agreement) is None
    watcher._on_signal(15, None)
    assert _decide(agreement) == "leave" and agreement.leaving == [1]


def test_a_replacement_beside_a_node_waits_for_the_run_to_let_it_go():
    order: list[str] = []

    def replace(name, retire=None):
        order.append("launched")
        retire(True)
        order.append("old machine ended")
        return "inventory"

    replacements, events = Replacements(replace), Events()
    replacements.listen(events)
    replacements.ask("node-2", beside=True)
    retire = events.take(10)
    assert isinstance(retire, Retire) and (retire.node, retire.ready) == ("node-2", True) and order == ["launched"]
    replacements.retired("node-2")
    ready = events.take(10)
    assert isinstance(ready, ReplacementReady) and order == ["launched", "old machine ended"]


def test_the_runs_wait_for_the_replacement_lets_a_kept_node_go_and_nobody_listening_lets_it_go_at_once():
    replacements, events = Replacements(lambda name, retire=None: retire(True) or "inventory"), Events()
    replacements.listen(events)
    replacements.ask("node-0", beside=True)
    assert isinstance(events.take(10), Retire)
    replacements.listen(None)  # the attempt ended (the head's ranks stopped at their deadline): still kept
    assert replacements.under_way("node-0") and replacements.launched("node-0")
    # Recovery waits for it -- the old node goes -- even where it would not wait for a whole launch (0 s: a shrink):
    assert replacements.wait("node-0", 0.0).inventory == "inventory"

    ended, events = Replacements(lambda name, retire=None: retire(True) or "inventory"), Events()
    ended.listen(events)
    ended.ask("node-2", beside=True)
    assert isinstance(events.take(10), Retire)
    ended.finish(lambda line: None, patience=10)  # the run's end lets it go too
    assert not ended.under_way("node-2")

    alone = Replacements(lambda name, retire=None: retire(True) or "inventory")
    alone.ask("node-1", beside=True)
    assert alone.wait("node-1", 10).inventory == "inventory"


class FakeReplacements:
    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []
        self.let_go: list[str] = []

    def ask(self, name, beside=False):
        self.asked.append((name, beside))

    def retired(self, name):
        self.let_go.append(name)


def _stays(blocked=lambda name: None, recover_left=True):
    said, lost = [], []
    recovery = SimpleNamespace(replacements=FakeReplacements(), may_recover=lambda: recover_left,
                               timeline=SimpleNamespace(events=[], add=lambda e, d="", at=None: None),
                               cluster=SimpleNamespace(provider="local"))
    recovery.timeline.add = lambda event, detail="", at=None: recovery.timeline.events.append(event)
    members = SimpleNamespace(names=["node-0", "node-1", "node-2"])
    stopped: list[str] = []
    stays = Stays(members, recovery, said.append, lambda name, why, pending: lost.append((name, why)), blocked,
                  stopped.extend)
    stays.stopped = stopped  # what the tests read: the nodes whose ranks were stopped
    return stays, recovery, said, lost


def _notice(node: str) -> JobRecord:
    return JobRecord(node, channel.NOTICE, {"rank": 2, "time": _at(120), "leave_by": time.time() + 90})


def test_a_notice_asks_the_replacement_beside_the_node_once():
    stays, recovery, said, _ = _stays()
    pending = {"node-0", "node-1", "node-2"}
    assert stays.take(_notice("node-2"), pending) and stays.take(_notice("node-2"), pending)  # its other rank's
    assert recovery.replacements.asked == [("node-2", True)]
    assert recovery.timeline.events == ["notice", "replacement asked"] and "train on" in said[0]


def test_the_call_back_lets_a_member_go_and_its_end_lets_the_provider_go_on():
    stays, recovery, _, lost = _stays()
    pending = {"node-0", "node-1", "node-2"}
    stays.take(_notice("node-2"), pending)
    assert stays.take(Retire("node-2"), pending)
    assert lost == [("node-2", "its replacement is ready")] and recovery.replacements.let_go == []
    assert not stays.take(NodeEnded("node-2", 75), pending)  # the loop's own decisions still see the end
    assert recovery.replacements.let_go == ["node-2"]


def test_the_head_is_not_let_go_its_ranks_stop_once_its_replacement_is_ready():
    stays, recovery, said, lost = _stays(blocked=lambda name: "node-0 is the head" if name == "node-0" else None)
    pending = {"node-0", "node-1"}
    stays.take(_notice("node-0"), pending)
    stays.take(Retire("node-0"), pending)  # launched beside it: ready
    stays.stopping.join(5.0)  # the stop runs on a thread; the attempt joins it at its end (Stays.join)
    assert not stays.stopping.is_alive()
    assert lost == [] and recovery.replacements.let_go == [] and stays.stopped == ["node-0"]
    assert said[-1].endswith("node-0 is the head: its ranks stop now (every rank's coordinated checkpoint) and the "
                             "job starts again on the replacement")
    assert not stays.take(NodeEnded("node-0", 75), pending)
    assert recovery.replacements.let_go == []  # not before the sweep
    stays.take(Retire("node-2"), pending)  # its ranks left at their deadline: not pending any more
    assert recovery.replacements.let_go == ["node-2"]


def test_a_head_whose_replacement_launches_only_once_its_machine_is_gone_trains_on_to_its_deadline():
    """EC2's provider calls back first (``ready`` false): stopping the head then would trade its training for a
    wait on the whole launch. A budget spent: nothing would take the job on, so its ranks train on too."""
    stays, recovery, said, lost = _stays(blocked=lambda name: "node-0 is the head" if name == "node-0" else None)
    pending = {"node-0", "node-1"}
    stays.take(_notice("node-0"), pending)
    stays.take(Retire("node-0", ready=False), pending)
    assert lost == [] and stays.stopping is None and stays.stopped == [] and said[-1].endswith(
        "launched once its machine is gone; node-0 is the head: its ranks stay until they stop at the notice's "
        "deadline")
    spent, recovery, said, _ = _stays(blocked=lambda name: "RECOVER=1 recoveries spent", recover_left=False)
    spent.take(Retire("node-1"), {"node-0", "node-1"})
    assert spent.stopping is None and spent.stopped == [] and "stay until" in said[-1]


def test_no_replacement_is_asked_once_recover_is_spent():
    stays, recovery, _, _ = _stays(recover_left=False)
    assert stays.take(_notice("node-1"), {"node-0", "node-1"}) and recovery.replacements.asked == []


def test_the_record_is_one_line_the_run_reads():
    line = channel.line(channel.NOTICE, {"rank": 3, "time": "2026-12-07T12:00:00Z", "leave_by": 1.5})
    record = channel.parse(line)
    assert record.kind == channel.NOTICE and json.loads(line.split(" ", 1)[1])["rank"] == 3


def test_the_margin_is_30_s_unless_set_to_positive_seconds():
    assert notice.margin_from_env({}) == notice.STAY_MARGIN == 30.0
    assert notice.margin_from_env({"MULTINODE_NOTICE_MARGIN": "60"}) == 60.0
    for bad in ("x", "0", "-5"):
        with pytest.raises(ValueError, match="MULTINODE_NOTICE_MARGIN=.* e.g. MULTINODE_NOTICE_MARGIN=60"):
            notice.margin_from_env({"MULTINODE_NOTICE_MARGIN": bad})
