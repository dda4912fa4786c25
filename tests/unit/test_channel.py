"""The job channel (training/channel.py): every record the trainer and the helpers send reads back as it was sent,
through the one pattern the orchestrator uses; lines that are not records are not taken for one."""

from __future__ import annotations

import io

import pytest

from training import channel


@pytest.mark.parametrize("kind", channel.KINDS)
def test_every_kind_reads_back_as_sent(kind):
    payload = {"step": 7, "nested": {"a": [1, 2]}, "text": "x y"}
    out = io.StringIO()
    channel.send(kind, payload, out)
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1  # one write, one line
    assert channel.parse("[node-1] [rank0]: " + text.rstrip("\n")) == channel.Record(kind, payload)


def test_an_unknown_kind_is_refused_when_sent():
    with pytest.raises(ValueError, match="unknown record kind 'RESULTS'"):
        channel.line("RESULTS", {})


def test_lines_that_are_not_records_are_not_read_as_one():
    for text in ("RESULT {not json}", "RESULT [1, 2]", "PREEMPTEDX {}", "XMARK {\"a\": 1}", "epoch 3 MARK of 4",
                 "STEPTIMES", ""):
        assert channel.parse(text) is None


def test_mpiruns_tag_glued_after_a_record_is_tolerated():
    """mpirun --tag-output can glue the next chunk's tag after a line written in two pieces."""
    line = 'RESULT {"acc": 0.97}[1,0]<stdout>:'
    assert channel.parse(line) == channel.Record("RESULT", {"acc": 0.97})


def test_last_and_every_pick_by_kind_in_order():
    lines = ['MARK {"mark": "first_step", "at": 1.0, "step": 1}', 'RESULT {"a": 1}', "noise",
             'MARK {"mark": "steps", "at": 2.0, "step": 5}', 'RESULT {"a": 2}']
    assert channel.last(lines, "RESULT") == {"a": 2} and channel.last(lines, "PREEMPTED") is None
    assert [m["step"] for m in channel.every(lines, "MARK")] == [1, 5]


def test_the_typed_records_read_their_payloads_and_refuse_a_wrong_shape():
    assert channel.Mark.read({"mark": "checkpoint", "at": 3, "seconds": 1.5, "kind": "periodic", "step": 4}) == \
        channel.Mark("checkpoint", 3.0, 4, 1.5, "periodic")
    assert channel.Mark.read({"mark": "steps"}) is None
    window = {"rank": 2, "steps": 9, "step_ms": 50.0, "compute_ms": 45.0, "comm_ms": 5.0}
    assert channel.StepTimes.read(window) == channel.StepTimes(2, 9, 50.0, 45.0, 5.0)
    assert channel.StepTimes.read({"rank": "x"}) is None
    membership = channel.Membership(3, ["h0", "h1"], 2, ["h1"])
    assert channel.Membership.from_json(membership.to_json()) == membership and membership.world_size == 4
    assert channel.Membership.from_json("{") is None


def test_heartbeat_files_are_named_and_read_one_way():
    assert channel.heartbeat_name(3) == "heartbeat-rank3"
    assert channel.heartbeat_glob("/runs/r1") == "/runs/r1/heartbeat-rank*"
    assert channel.heartbeat_steps("12\n40\n\n") == [12, 40]
