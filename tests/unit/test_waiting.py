"""A rank's word that its step waits on a peer (training.waiting): said once per step, only past the bound (the
rank's typical step times WAIT_FACTOR, at least WAIT_FLOOR), never while warming up; its record on the channel."""

from __future__ import annotations

import io

from multinode.trainer import channel, waiting


def _timed(steps: list[float]) -> waiting.Waiting:
    watch = waiting.Waiting(rank=1, out=io.StringIO())
    watch.times.extend(steps)
    return watch


def test_nothing_is_said_while_warming_up_or_between_steps():
    watch = _timed([0.1] * (waiting.WARMUP - 1))
    watch.began, watch.number, watch.begun = 100.0, 7, 1
    assert watch.due(200.0) is None  # too few steps timed
    watch = _timed([0.1] * waiting.WARMUP)
    assert watch.due(200.0) is None  # no step under way


def test_a_step_past_its_bound_is_said_once_and_the_bound_has_a_floor():
    watch = _timed([0.02] * 10)  # 5 x 0.02 s = 0.1 s: the floor holds
    assert watch.bound() == waiting.WAIT_FLOOR
    watch.began, watch.number, watch.begun = 100.0, 7, 1
    assert watch.due(100.0 + waiting.WAIT_FLOOR - 0.01) is None
    record = watch.due(100.0 + waiting.WAIT_FLOOR + 0.01)
    assert record is not None and record["rank"] == 1 and record["step"] == 7 and "seconds" in record
    assert watch.due(130.0) is None  # said once for this step
    watch.begun += 1  # the next step -- or the same step tried again after a change -- is said again
    assert watch.due(130.0) is not None
    slow = _timed([1.0] * 10)
    assert slow.bound() == waiting.WAIT_FACTOR * 1.0


def test_a_step_is_timed_and_the_record_is_the_channels():
    watch = waiting.Waiting(rank=0, out=io.StringIO())
    for number in range(3):
        with watch.step(number):
            pass
    assert len(watch.times) == 3 and watch.began is None
    text = channel.line(channel.WAITING, {"rank": 0, "host": "h", "step": 3, "seconds": 0.7})
    record = channel.parse(text)
    assert record is not None and record.kind == channel.WAITING and record.data["step"] == 3


def test_an_epochs_end_is_timed_against_the_earlier_ones_from_the_second_on():
    watch = waiting.Waiting(rank=0, out=io.StringIO(), what="epoch end", warmup=1)
    assert watch.bound() is None
    watch.times.append(2.0)
    assert watch.bound() == waiting.WAIT_FACTOR * 2.0
    watch.began, watch.number, watch.begun = 0.0, 120, 1
    record = watch.due(waiting.WAIT_FACTOR * 2.0 + 0.1)
    assert record is not None and record["what"] == "epoch end" and record["step"] == 120
