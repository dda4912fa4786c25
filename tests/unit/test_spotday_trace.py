"""The spot day's trace (bench.spotday_trace): the committed file is what its generator makes of its seed, holds
what the issue asks (8 or more events of 4 or more kinds, every kind here), and compresses only the time between
events -- a notice's lead, a replacement's launch time, a shortage's and a slowdown's length are the sources'."""

from __future__ import annotations

import json
import re

import pytest

from bench import spotday
from bench.spotday_trace import (KINDS, MIN_GAP, NOTICE_LEAD, QUICK, SLOW_SECONDS, SOURCES, Event, acceptable,
                                 generate, load, main, off_model)


def test_the_committed_trace_is_its_generators_output_for_its_seed():
    committed = json.loads(spotday.TRACE.read_text())
    assert generate(committed["seed"]).to_json() == committed
    assert spotday.TRACE.name == f"spotday-{committed['seed']}.json"


def test_the_trace_has_enough_events_of_every_kind_each_source_cited():
    trace = load(spotday.TRACE)
    assert acceptable(trace) and len(trace.events) >= 8 and set(trace.kinds()) == set(KINDS)
    assert len(SOURCES) == 6 and all(re.search(r"\b[\w.-]+\.(com|io|ai)/\S", text) for text in SOURCES.values())
    assert not trace.quick and trace.factor > 1000  # weeks between interruptions, minutes in the replay


def test_only_the_time_between_events_is_compressed():
    trace = load(spotday.TRACE)
    times = [e.at for e in trace.events]
    assert times == sorted(times)
    for before, event in zip(trace.events, trace.events[1:]):
        gap = event.at - before.at
        if event.kind == "no_capacity" and event.real_gap_hours == 0:
            assert gap == 0  # a shortage starts with its interruption
        else:  # the real gap over the factor, or MIN_GAP where that is less (rounding to 0.1 s)
            assert gap == pytest.approx(max(event.real_gap_hours * 3600 / trace.factor, MIN_GAP), abs=0.2)
    assert off_model(trace) == []  # every figure within the published ranges (load refuses a trace otherwise)
    assert all(0 < e.share < 1 for e in trace.events if e.kind == "slow")


def test_a_trace_with_a_figure_outside_the_published_ranges_is_refused(tmp_path):
    data = json.loads(spotday.TRACE.read_text())
    notice = next(e for e in data["events"] if e["kind"] == "notice")
    notice["seconds"] = NOTICE_LEAD / 2
    slow = next(e for e in data["events"] if e["kind"] == "slow")
    slow["seconds"] = SLOW_SECONDS[1] + 1
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        load(tmp_path / "t.json")
    assert f"notice at {notice['at']} s: notice lead {NOTICE_LEAD / 2} s is outside" in str(err.value)
    assert f"slow at {slow['at']} s: slow {SLOW_SECONDS[1] + 1} s is outside" in str(err.value)


def test_the_generator_tries_the_next_seeds_until_one_has_every_kind(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["--seed", "1", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert acceptable(load(out)) and written["seed"] >= 1
    assert not any(acceptable(generate(seed)) for seed in range(1, written["seed"]))
    assert f"seed {written['seed']}" in capsys.readouterr().out


@pytest.mark.parametrize("fields, why", [
    ({"kind": "storm", "node": 1}, "event kind 'storm'"),
    ({"kind": "lost", "node": 1}, "needs the seconds its replacement takes"),
    ({"kind": "slow", "node": 1, "seconds": 60.0, "share": 1.5}, "a CPU share between 0 and 1"),
    ({"kind": "no_capacity", "node": 2, "seconds": 60.0}, "a node for every kind but no_capacity"),
])
def test_a_malformed_event_is_refused_naming_what_it_lacks(fields, why):
    with pytest.raises(ValueError, match=why):
        Event(10.0, **fields)


def test_the_quick_trace_says_it_is_one():
    assert QUICK.quick and len(QUICK.events) == 2 and QUICK.to_json()["quick"] is True


def test_a_shortage_at_the_second_of_a_loss_is_applied_first():
    """The committed trace has node-3 lost and replacements refused at the same +735 s, the loss first: the replay
    applies the shortage first, so the lost node's replacement finds no capacity (bench.spotday_replay.in_order)."""
    from bench.spotday_replay import in_order

    lost, short, later = (Event(735.0, "lost", node=3, replacement=139.0), Event(735.0, "no_capacity", seconds=226.0),
                          Event(780.0, "slow", node=3, seconds=68.0, share=0.03))
    assert in_order([later, lost, short]) == [short, lost, later]
    events = load(spotday.TRACE).events
    assert [e.kind for e in in_order(events) if e.at == 735.0] == ["no_capacity", "lost"]
