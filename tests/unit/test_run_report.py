"""The run report's page (multinode.diagnose.run_report.render) from recorded inputs: every section present, a
figure in each when the run recorded its data, a line saying what is missing otherwise, and nothing fetched from
anywhere. That the page renders in a real browser is tests/integration/test_ledger_local.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from multinode.diagnose.ledger import JobMarks, account
from multinode.diagnose.run_report import SECTIONS, epoch_rows, named_slow, render, slow_ranks, write

RUN = json.loads((Path(__file__).parent / "fixtures" / "ledger-runs.json").read_text())["notice"]
SLOW = json.loads((Path(__file__).parent / "fixtures" / "steplosses-slow-run.json").read_text())


def _summary(ledger: dict | None) -> dict:
    return {"run_id": "lg-rec", "outcome": "succeeded", "nodes": 2, "world_size": 2, "wall_seconds": RUN["wall"],
            "ledger": ledger}


def _ledger(run: dict = RUN) -> dict:
    jobs = [JobMarks(j["attempt"], tuple(j["nodes"]), tuple(j["marks"]), j["resumed_step"],
                     windows=tuple(j.get("windows") or _windows(j["nodes"]))) for j in run["jobs"]]
    return account(run["spans"], jobs, run["wall"], run["began_unix"])


def _windows(nodes: list[str]) -> list[dict]:
    """Made-up step-time windows, every rank alike (the recorded notice run kept none)."""
    return [{"node": node, "rank": rank, "steps": 20, "step_ms": 20.0, "compute_ms": 15.0, "comm_ms": 5.0}
            for _ in range(5) for rank, node in enumerate(nodes)]


def test_every_section_has_its_figure_and_the_page_loads_nothing():
    rows = [{"epoch": e, "loss": 1.0 / (e + 1), "val_loss": 1.1 / (e + 1), "val_accuracy": 0.9, "samples_per_s": 5000,
             "step_time_by_rank": [0.01, 0.012]} for e in range(3)]
    events = [{"event": "notice", "at": RUN["began_unix"] + 15.7, "detail": "a notice on node-1"}]
    page = render(_summary(_ledger()), {"events": events}, rows)
    for key in SECTIONS:
        assert re.search(rf'<section id="{key}">.*?<img id="{key}-figure" [^>]*src="data:image/png;base64,', page), key
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script" not in page and "<link" not in page
    assert "goodput " in page and "a notice on node-1" in page


def test_a_run_without_ledger_or_metrics_says_so_in_each_section():
    page = render(_summary(None), {}, [])
    for key in SECTIONS:
        assert f'<section id="{key}">' in page
    assert "<img" not in page and page.count("no per-epoch metrics") == 3


def test_the_throttled_node_is_marked_on_the_compute_figure_with_why():
    """The recorded run with node-1 held to 0.04 of a core: its rank is named on the page, as the run named it and as
    the ledger's slow steps attribute them."""
    ledger = _ledger(SLOW)
    summary = {**_summary(ledger), "nodes": 4, "world_size": 4, "slow_ranks": SLOW["slow_ranks"]}
    assert [(m["rank"], m["node"]) for m in slow_ranks(summary, ledger)] == [(1, "node-1")]
    page = render(summary, {}, [])
    compute = re.search(r'<section id="compute">(.*?)</section>', page)[1]
    assert re.search(r"node-1 rank 1: named slow \(2\.5x the others&#x27; compute\); held steps back 19s", compute)
    assert '<img id="compute-figure"' in compute
    assert "slow steps held back by node-1 rank 1 19s" in page
    quiet = render(_summary(_ledger()), {}, [])
    assert "no rank named slow and none held steps back" in re.search(r'<section id="compute">(.*?)</section>',
                                                                      quiet)[1]


def test_epoch_rows_take_every_attempt_and_the_latest_row_of_an_epoch(tmp_path):
    (tmp_path / "attempt-0").mkdir()
    (tmp_path / "attempt-0" / "metrics.jsonl").write_text('{"epoch": 0, "loss": 2}\n{"epoch": 1, "loss": 1}\n')
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.9}\n{"epoch": 2, "loss": 0.5}\nnot json\n'
                                            '{"event": "test", "test_loss": 0.4}\n')
    assert [(r["epoch"], r["loss"]) for r in epoch_rows(tmp_path)] == [(0, 2), (1, 0.9), (2, 0.5)]


def test_the_page_of_a_recovered_run_marks_a_rank_an_earlier_attempt_named(tmp_path):
    """Each attempt's summary names its own slow ranks; the recovery keeps the earlier ones under attempt-<k>/."""
    (tmp_path / "attempt-0").mkdir()
    (tmp_path / "attempt-0" / "summary.json").write_text(json.dumps({"slow_ranks": SLOW["slow_ranks"]}))
    summary = {**_summary(_ledger()), "slow_ranks": None}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert named_slow(tmp_path, summary) == SLOW["slow_ranks"]
    page = write(tmp_path).read_text()
    assert re.search(r"node-1 rank 1: named slow \(2\.5x", re.search(r'<section id="compute">(.*?)</section>', page)[1])
