"""The ledger (multinode.diagnose.ledger) on recorded inputs: the phase spans and rank 0's MARK lines of two real
local runs (tests/unit/fixtures/ledger-runs.json, each entry says when and how it was made) and small made-up
variations of them; and the job's side (training/marks.py) with a fake clock. Identities, not timings: the buckets
tile the wall time, each mark lands in the bucket the module doc names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multinode.diagnose.goodput import duration, goodput_line
from multinode.diagnose.ledger import BUCKETS, JobMarks, account, parse_marks
from training.marks import Marks

RUNS = json.loads((Path(__file__).parent / "fixtures" / "ledger-runs.json").read_text())


def _ledger(run: dict, jobs: list[JobMarks] | None = None, spans: list[dict] | None = None) -> dict:
    jobs = jobs if jobs is not None else [JobMarks(j["attempt"], tuple(j["nodes"]), tuple(j["marks"]),
                                                   j["resumed_step"], j["reached_step"]) for j in run["jobs"]]
    return account(spans if spans is not None else run["spans"], jobs, run["wall"], run["began_unix"])


def _adds_up(ledger: dict) -> None:
    total = sum(ledger["buckets"].values())
    assert abs(total - ledger["wall_seconds"]) <= 0.01 * ledger["wall_seconds"], (total, ledger["wall_seconds"])
    assert all(v >= 0 for v in ledger["buckets"].values()), ledger["buckets"]
    assert list(ledger["buckets"]) == list(BUCKETS)


def test_a_plain_run_adds_up_and_its_job_is_start_training_checkpoint_teardown():
    run = RUNS["plain"]
    ledger = _ledger(run)
    _adds_up(ledger)
    b = ledger["buckets"]
    assert b["training"] > 0 and b["start"] > 0 and b["checkpoint"] > 0 and b["teardown"] > 0
    assert b["recovery"] == 0 and b["trained twice"] == 0 and b["job"] == 0 and ledger["recoveries"] == []
    job = next(s for s in run["spans"] if s["phase"] == "job")
    first = next(m for m in run["jobs"][0]["marks"] if m["mark"] == "first_step")
    launch = next(s for s in run["spans"] if s["phase"] == "start")
    # start = the launch phase + the job's processes up to the end of their first step
    assert b["start"] == pytest.approx(launch["to"] - launch["from"] + first["at"] - run["began_unix"] - job["from"],
                                       abs=0.01)
    assert ledger["goodput"] == pytest.approx(b["training"] / run["wall"], abs=1e-3)


def test_a_notice_recovery_has_its_three_parts_and_no_step_trained_twice():
    ledger = _ledger(RUNS["notice"])
    _adds_up(ledger)
    assert [r["recovery"] for r in ledger["recoveries"]] == [1]
    parts = ledger["recoveries"][0]
    assert parts["detect"] > 0 and parts["replace"] > 0 and parts["restart"] > 0
    assert ledger["buckets"]["recovery"] == pytest.approx(parts["detect"] + parts["replace"] + parts["restart"],
                                                          abs=0.01)
    assert ledger["steps_trained_twice"] == 0 and ledger["buckets"]["trained twice"] == 0
    kinds = [c[2] for a in ledger["attempts"] for c in a["checkpoints"]]
    assert "coordinated" in kinds and "periodic" in kinds


def test_a_membership_change_inside_an_attempt_is_a_recovery_of_its_own_before_a_later_restart():
    """The notice run as if its first attempt had also paused 0.2 s for a membership change (a made-up ``pause``
    mark between two step marks): two recoveries in the order they began, the pause first and only its part, the
    restart's three parts untouched; the pause's seconds come out of training."""
    run = RUNS["notice"]
    plain = _ledger(run)
    first, *rest = run["jobs"]
    steps = sorted((m for m in first["marks"] if m["mark"] in ("first_step", "steps", "last_step")),
                   key=lambda m: m["at"])
    at = (steps[0]["at"] + steps[-1]["at"]) / 2
    paused = {"mark": "pause", "at": at, "seconds": 0.2, "kind": "lost", "step": steps[0]["step"]}
    jobs = [JobMarks(first["attempt"], tuple(first["nodes"]), tuple(first["marks"]) + (paused,), first["resumed_step"],
                     first["reached_step"])] + [JobMarks(j["attempt"], tuple(j["nodes"]), tuple(j["marks"]),
                                                         j["resumed_step"], j["reached_step"]) for j in rest]
    ledger = _ledger(run, jobs)
    _adds_up(ledger)
    assert [r["recovery"] for r in ledger["recoveries"]] == [1, 2]
    pause, restart = ledger["recoveries"]
    assert pause == {"recovery": 1, "detect": 0.0, "replace": 0.0, "restart": 0.0, "pause": 0.2}
    assert {k: v for k, v in restart.items() if k != "recovery"} == {
        k: v for k, v in plain["recoveries"][0].items() if k != "recovery"}
    assert ledger["buckets"]["training"] == pytest.approx(plain["buckets"]["training"] - 0.2, abs=1e-3)
    assert "(2 recoveries, " in goodput_line(ledger)


def test_a_lost_attempt_accounts_the_steps_past_its_snapshot_as_trained_twice():
    """The same run as if node-1 had been lost: no coordinated checkpoint, the heartbeat saw step 235, and the next
    attempt resumed from the snapshot of step 200 (made-up variation of the recorded run)."""
    run = RUNS["notice"]
    first, second = run["jobs"]
    lost = JobMarks(0, tuple(first["nodes"]), tuple(m for m in first["marks"] if m.get("kind") != "coordinated"
                                                     and m["mark"] != "last_step"), None, reached_step=235)
    again = JobMarks(1, tuple(second["nodes"]), tuple(second["marks"]), resumed_step=200)
    ledger = _ledger(run, [lost, again])
    _adds_up(ledger)
    assert ledger["steps_trained_twice"] == 35
    assert ledger["buckets"]["trained twice"] > 0
    assert ledger["attempts"][0]["steps"] == [1, 200]  # its last periodic checkpoint says step 200 was trained


def test_steps_past_the_last_mark_that_the_next_attempt_keeps_are_training_not_detection():
    """A script that marks its steps but not its checkpoints, lost after its first mark: the heartbeat saw step
    235, the next attempt resumed from 200, so steps 2..200 were trained once (made-up variation)."""
    run = RUNS["notice"]
    first, second = run["jobs"]
    only_first = tuple(m for m in first["marks"] if m["mark"] == "first_step")
    again = JobMarks(1, tuple(second["nodes"]), tuple(second["marks"]), resumed_step=200)
    heard = _ledger(run, [JobMarks(0, tuple(first["nodes"]), only_first, reached_step=235), again])
    unheard = _ledger(run, [JobMarks(0, tuple(first["nodes"]), only_first), again])
    _adds_up(heard)
    _adds_up(unheard)
    assert heard["steps_trained_twice"] == 35 and unheard["steps_trained_twice"] == 0
    assert heard["buckets"]["training"] > unheard["buckets"]["training"]
    assert heard["recoveries"][0]["detect"] < unheard["recoveries"][0]["detect"]


def test_a_job_that_marks_nothing_is_one_job_bucket_from_its_start_to_its_end():
    run = RUNS["plain"]
    ledger = _ledger(run, [JobMarks(0, ("node-0", "node-1"))])
    _adds_up(ledger)
    job = next(s for s in run["spans"] if s["phase"] == "job")
    assert ledger["buckets"]["job"] == pytest.approx(job["to"] - job["from"], abs=0.001)
    assert ledger["buckets"]["training"] == 0 and ledger["goodput"] == 0
    assert ledger["attempts"][0]["reported"] is False


def test_the_data_phase_is_sync_and_a_phase_it_does_not_know_is_other_by_name():
    run = RUNS["plain"]
    spans = [dict(s) for s in run["spans"]]
    assert [s["phase"] for s in spans[:4]] == ["claim", "pre-flight", "link check", "sync"]
    spans[2]["to"] -= 0.05  # the last 50 ms of the link check made a data phase
    spans.insert(3, {"phase": "data", "attempt": 0, "from": spans[2]["to"], "to": spans[3]["from"]})
    ledger = _ledger(run, spans=spans)
    _adds_up(ledger)
    assert ledger["other"] == {} and ledger["buckets"]["sync"] > _ledger(run)["buckets"]["sync"]  # DATA: sync
    spans[3]["phase"] = "something new"
    ledger = _ledger(run, spans=spans)
    _adds_up(ledger)
    assert set(ledger["other"]) == {"something new"}


def test_the_goodput_line_names_training_first_then_the_rest_by_size():
    ledger = _ledger(RUNS["notice"])
    line = goodput_line(ledger)
    assert line.startswith(f"goodput {ledger['goodput'] * 100:.0f} % of {duration(RUNS['notice']['wall'])}: training ")
    assert "recovery " in line and "1 recovery, 0 steps trained twice" in line
    assert duration(312) == "5m12s" and duration(14.2) == "14s" and duration(0.44) == "0.4s" and duration(3725) == "1h02m"


def test_a_script_that_reports_no_step_gets_no_goodput_share():
    ledger = {"buckets": {**dict.fromkeys(BUCKETS, 0.0), "job": 40.0, "start": 2.0, "sync": 3.0}, "goodput": 0.0,
              "wall_seconds": 45.0, "recoveries": []}
    assert goodput_line(ledger) == ("goodput not known of 45s: job 40s (start and steps: the script reports no step), "
                                    "sync 3.0s, start 2.0s")


def test_mark_lines_are_found_in_prefixed_logs_and_bad_ones_skipped():
    lines = ['[node-0] [rank0]: MARK {"mark": "first_step", "at": 10.5, "step": 1}', "MARK {not json",
             'MARK {"mark": "steps"}', "epoch 1/3 loss 0.1"]
    assert parse_marks(lines) == [{"mark": "first_step", "at": 10.5, "step": 1}]


def test_the_job_side_marks_first_step_progress_checkpoints_and_the_last_step_once():
    now = [100.0]
    said: list[str] = []
    marks = Marks(True, clock=lambda: now[0], write=said.append)
    for step in range(1, 5):
        now[0] += 10
        marks.step(step)
        if step == 2:
            with marks.checkpoint("periodic"):
                now[0] += 3
    marks.done()
    marks.done()
    got = parse_marks(said)
    assert [m["mark"] for m in got] == ["first_step", "checkpoint", "steps", "last_step"]
    assert got[0]["step"] == 1 and got[1]["seconds"] == 3 and got[1]["step"] == 2 and got[-1]["step"] == 4
    quiet: list[str] = []
    other = Marks(False, clock=lambda: now[0], write=quiet.append)
    other.step(1)
    other.done()
    assert quiet == []
