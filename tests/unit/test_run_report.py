"""The run report's page (multinode.diagnose.run_report.render) from recorded inputs: every section present, a
figure in each when the run recorded its data, a line saying what is missing otherwise, and nothing fetched from
anywhere. That the page renders in a real browser is tests/integration/test_ledger_local.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from multinode.diagnose.ledger import JobMarks, account
from multinode.diagnose.run_report import SECTIONS, epoch_rows, render

RUN = json.loads((Path(__file__).parent / "fixtures" / "ledger-runs.json").read_text())["notice"]


def _summary(ledger: dict | None) -> dict:
    return {"run_id": "lg-rec", "outcome": "succeeded", "nodes": 2, "world_size": 2, "wall_seconds": RUN["wall"],
            "ledger": ledger}


def _ledger() -> dict:
    jobs = [JobMarks(j["attempt"], tuple(j["nodes"]), tuple(j["marks"]), j["resumed_step"]) for j in RUN["jobs"]]
    return account(RUN["spans"], jobs, RUN["wall"], RUN["began_unix"])


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


def test_epoch_rows_take_every_attempt_and_the_latest_row_of_an_epoch(tmp_path):
    (tmp_path / "attempt-0").mkdir()
    (tmp_path / "attempt-0" / "metrics.jsonl").write_text('{"epoch": 0, "loss": 2}\n{"epoch": 1, "loss": 1}\n')
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.9}\n{"epoch": 2, "loss": 0.5}\nnot json\n'
                                            '{"event": "test", "test_loss": 0.4}\n')
    assert [(r["epoch"], r["loss"]) for r in epoch_rows(tmp_path)] == [(0, 2), (1, 0.9), (2, 0.5)]
