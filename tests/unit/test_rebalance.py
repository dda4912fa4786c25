"""A rebalance recommendation is a save, not a stop; a notice older than the run is ignored -- the watcher and the
agreement on their own, pure: no sockets, no processes (the real job: tests/integration/test_preempt_local.py)."""

from __future__ import annotations

import calendar
import logging
import threading
import time

from training import imds, preempt

T0 = calendar.timegm(time.strptime("2026-11-25T10:00:00Z", "%Y-%m-%dT%H:%M:%SZ"))


class Script:
    """A metadata client answering one notice (or None) per poll, then the last one again."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def poll(self):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_notice_time_is_read_in_whole_utc_seconds():
    assert imds.Notice("rebalance", None, "2026-11-25T10:00:00Z").epoch() == T0
    assert imds.Notice("signal", "SIGTERM", None).epoch() is None
    assert imds.Notice("rebalance", None, "not a time").epoch() is None
    late = imds.Notice("rebalance", None, "2026-11-25T10:00:00Z")
    assert late.older_than(T0 + 1.0) and not late.older_than(T0 + 0.9)  # the run's own first second is not older


def test_only_a_rebalance_does_not_stop():
    assert not imds.parse_rebalance('{"noticeTime": "2020-11-05T08:22:00Z"}').stops
    assert imds.parse_instance_action('{"action": "terminate", "time": "2017-09-18T08:22:00Z"}').stops
    assert imds.Notice("signal", "SIGTERM", "t", "signal").stops and imds.Notice("peer").stops


def test_a_rebalance_is_taken_once_per_notice_time_and_is_no_stop():
    watcher = preempt.Watcher(None, None, started=T0)
    rebalance = imds.Notice("rebalance", None, "2026-11-25T10:00:05Z")
    watcher.note(rebalance)
    assert not watcher.requested() and watcher.take_rebalance() == rebalance and watcher.take_rebalance() is None
    watcher.note(rebalance)  # the service shows it until the instance goes: the same one is not taken again
    assert watcher.take_rebalance() is None
    watcher.note(imds.Notice("rebalance", None, "2026-11-25T10:05:00Z"))  # a new one is
    assert watcher.take_rebalance() is not None and not watcher.requested()


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_watcher_ignores_notices_older_than_its_run_and_says_so_once():
    old_action = imds.Notice("interruption", "terminate", "2026-11-25T09:59:00Z")
    watcher = preempt.Watcher(Script(old_action, old_action, None), None, poll=0.001, started=T0)
    said = Lines()
    logger = logging.getLogger("training")
    level, disabled = logger.level, logger.disabled  # other tests configure the trainer's logger
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    try:
        for _ in range(3):
            notice = watcher.client.poll()
            if notice is not None and not watcher.stale(notice):
                watcher.note(notice)
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
        logger.disabled = disabled
    assert not watcher.requested()
    stale = [line for line in said.lines if "older than this run" in line]
    assert len(stale) == 1 and "spot interruption notice (terminate at 2026-11-25T09:59:00Z)" in stale[0], said.lines


def test_the_polling_thread_goes_on_after_a_rebalance_and_stops_on_the_interruption():
    rebalance = imds.Notice("rebalance", None, "2026-11-25T10:00:05Z")
    action = imds.Notice("interruption", "terminate", "2026-11-25T10:02:05Z")
    watcher = preempt.Watcher(Script(None, rebalance, rebalance, action), None, poll=0.001, started=T0).start()
    try:
        assert watcher.wait(30)  # the interruption came after the rebalance, on the same thread
    finally:
        watcher.close()
    assert watcher.notice == action and watcher.take_rebalance() == rebalance


class MaxAllReduce:
    """A MAX all-reduce among ``n`` threads, as the process group does among ranks: each rank blocks until every
    rank has offered its values, then every rank gets the element-wise MAX; the step time as 50 ms (a check every
    20 steps), whatever these steps of nothing took."""

    def __init__(self, n: int):
        self.offers: list[list[float]] = []
        self.result: list[float] = []
        self.barrier = threading.Barrier(n, action=self._reduce)

    def _reduce(self) -> None:
        self.result = [max(column) for column in zip(*self.offers)][:1] + [0.05]
        self.offers = []

    def __call__(self, values: list[float]) -> list[float]:
        self.offers.append(values)
        self.barrier.wait(timeout=30)
        result = list(self.result)
        self.barrier.wait(timeout=30)  # every rank has read it before the next round
        return result


def _lockstep(watchers, on_step, steps: int = 300):
    """Every rank in a thread of its own, :meth:`Agreement.check` after each step; {step: [each rank's answer]}."""
    reduce = MaxAllReduce(len(watchers))
    agreements = [preempt.Agreement(w, reduce) for w in watchers]
    decisions: dict[int, list] = {step: [None] * len(watchers) for step in range(1, steps + 1)}
    gate = threading.Barrier(len(watchers), action=lambda: None)

    def rank(r: int) -> None:
        for step in range(1, steps + 1):
            if r == 0:
                on_step(step)
            gate.wait(timeout=30)  # the step's notices are in place before any rank checks
            decisions[step][r] = agreements[r].check()
            gate.wait(timeout=30)
            if decisions[step][r] == "stop":
                return

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(watchers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return agreements, decisions


def test_every_rank_saves_at_the_same_step_for_one_rank_s_rebalance_and_goes_on():
    watchers = [preempt.Watcher(None, grace=10.0, started=T0) for _ in range(3)]

    def on_step(step):
        if step == 7:
            watchers[1].note(imds.Notice("rebalance", None, "2026-11-25T10:00:05Z"))
        if step == 50:
            watchers[2].note(imds.Notice("interruption", "terminate", "2026-11-25T10:02:05Z"))

    agreements, decisions = _lockstep(watchers, on_step)
    saves = [step for step, answers in decisions.items() if "save" in answers]
    assert len(saves) == 1 and decisions[saves[0]] == ["save"] * 3 and saves[0] >= 7, decisions
    assert agreements[1].rebalance is not None and agreements[0].rebalance is None
    stops = [step for step, answers in decisions.items() if "stop" in answers]
    assert stops and decisions[stops[0]] == ["stop"] * 3 and stops[0] >= 50  # the interruption still stops


def test_make_preempt_refuses_an_unknown_notice_before_reading_any_state(tmp_path):
    import pytest

    from multinode.app import verbs
    from multinode.core.errors import UserError

    with pytest.raises(UserError, match=r"NOTICE=reboot .* use NOTICE=interruption .* or NOTICE=rebalance"):
        verbs.preempt("no-such-cluster", "1", 0.0, notice="reboot")


def test_a_watcher_counts_the_run_from_its_process_start():
    """A notice that came while the rank imported torch is the run's: the watcher's start is the process's."""
    started = imds.process_started()
    assert preempt.Watcher(None, None).started == started == imds.process_started()  # the same start each time
    assert isinstance(imds.process_started(pid=2**22 + 7), float)  # no such process: now, never an error
