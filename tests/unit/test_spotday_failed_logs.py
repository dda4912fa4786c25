"""A failed spot-day replay keeps its runs' logs (bench.spotday_methods): the bench removes each method's cluster
home at the end, and a full replay's failure once left nothing to read (2026-11-28). Run on a stand-in replay whose
cluster is a directory: nothing is started."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import spotday_methods


class _Cluster:
    def __init__(self, home: Path) -> None:
        self.home, self.name = home, "sdour-test"


class _Replay(spotday_methods.Replay):
    def __init__(self, method, job, trace, replaces, reports, home: Path) -> None:  # no cluster brought up
        self.cluster, self.method, self.downed = _Cluster(home), method, False

    def begin(self):
        logs = self.cluster.home / self.cluster.name / "runs" / "ours"
        logs.mkdir(parents=True)
        (logs / "node-2.log").write_text("[rank2]: RuntimeError: Connection closed by peer\n")

    def down(self) -> None:
        self.downed = True
        shutil.rmtree(self.cluster.home)


def test_a_failed_replay_keeps_its_runs_logs_before_its_cluster_goes(tmp_path, monkeypatch, capsys):
    made: list[_Replay] = []

    def replay(*args):
        made.append(_Replay(*args, home=tmp_path / "home"))
        return made[-1]

    monkeypatch.setattr(spotday_methods, "Replay", replay)

    def body(_replay) -> None:
        raise RuntimeError("ours: the run failed")

    with pytest.raises(RuntimeError, match="the run failed"):
        spotday_methods._replay("ours", None, None, "orchestrator", None, body)
    assert made[0].downed and not (tmp_path / "home").exists()
    said = capsys.readouterr().out
    kept = Path(said.split("kept in ")[1].strip())
    try:
        assert (kept / "ours" / "node-2.log").read_text().startswith("[rank2]: RuntimeError")
    finally:
        shutil.rmtree(kept.parent)


def test_a_replay_that_finishes_keeps_nothing(tmp_path, monkeypatch, capsys):
    made: list[_Replay] = []

    class _Finishing(_Replay):
        def finish(self):
            return "run"

    def replay(*args):
        made.append(_Finishing(*args, home=tmp_path / "home"))
        return made[-1]

    monkeypatch.setattr(spotday_methods, "Replay", replay)
    assert spotday_methods._replay("ours", None, None, "orchestrator", None, lambda r: None) == "run"
    assert made[0].downed and "kept in" not in capsys.readouterr().out
