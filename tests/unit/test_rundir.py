"""A run directory's layout (core/rundir.py): an ended attempt's files kept aside whole, the attempts listed in the
order they ended -- a grow-back between two recoveries included -- and the latest one last."""

from __future__ import annotations

import os

import pytest

from multinode.core.rundir import RunDir, runs


def _attempt(run: RunDir, mtime: float, marker: str) -> None:
    run.path.mkdir(parents=True, exist_ok=True)
    (run.path / "node-0.log").write_text(marker)
    run.summary.write_text("{}")
    os.utime(run.summary, (mtime, mtime))


def test_attempts_are_kept_whole_and_listed_in_the_order_they_ended(tmp_path):
    run = RunDir(tmp_path / "runs" / "r1")
    _attempt(run, 100.0, "first")
    run.keep(RunDir.kept_label("attempt", 0))
    _attempt(run, 200.0, "grown")
    run.keep(RunDir.kept_label("grow", 1))
    _attempt(run, 300.0, "second recovery")
    run.keep(RunDir.kept_label("attempt", 1))
    (run.path / "node-0.log").write_text("latest")
    order = [p.name for p in run.attempts()]
    assert order == ["attempt-0", "grow-1", "attempt-1", "r1"]  # not by name: grow-1 ended between the two
    assert [(p / "node-0.log").read_text() for p in run.attempts()] == ["first", "grown", "second recovery", "latest"]
    assert not run.summary.exists()  # the latest attempt has not ended yet


def test_a_kept_label_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="unknown kept attempt kind 'retry'"):
        RunDir.kept_label("retry", 1)


def test_runs_are_listed_oldest_first(tmp_path):
    for run_id in ("20261127-101500-bbbbbb", "20261127-091500-aaaaaa"):
        (tmp_path / run_id).mkdir()
    (tmp_path / "stray.txt").write_text("")
    assert [r.run_id for r in runs(tmp_path)] == ["20261127-091500-aaaaaa", "20261127-101500-bbbbbb"]
    assert runs(tmp_path / "none") == []
