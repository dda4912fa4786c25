"""The spot day's quick mode in the suite (``python -m bench.spotday --quick``): two events -- a node slowed, a node
lost with a 20 s replacement -- replayed on 4 local nodes for each of the four methods. Numbers are never asserted
(the quick mode's mean nothing); what must hold: every method trains every sample of every epoch (none missing),
the events reached every interrupted method, every verdict is computed from the stored figures, the ledger holds
the slowed node responsible for its slow steps and ours' run report marks it (named slow where the run named it),
and each method's cluster leaves nothing behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.spotday import QUICK_JOB
from bench.spotday_trace import QUICK

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
METHODS = {"uninterrupted", "ours", "torchrun", "restart"}


def test_the_quick_spot_day_replays_every_method_and_marks_the_slowed_rank(tmp_path):
    from leakcheck import NamespaceWatch, assert_nothing_left, require_root

    require_root()  # the replay's nodes are network namespaces
    with NamespaceWatch() as watch:
        res = subprocess.run([sys.executable, "-m", "bench.spotday", "--quick", "--out-dir", str(tmp_path),
                              "--reports", str(tmp_path / "reports")], cwd=REPO, capture_output=True, text=True,
                             timeout=2400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    entry = json.loads((tmp_path / "benchmarks.json").read_text())["spotday"]
    result = entry["result"]
    assert entry["quick"] and set(result["methods"]) == METHODS
    assert len(result["verdicts"]) == 7 and result["met"] is all(v["met"] for v in result["verdicts"])
    slowed, lost = QUICK.events
    for name, method in result["methods"].items():  # read from each method's own sample log
        assert method["epochs"] == QUICK_JOB.epochs and method["samples_missing"] == 0, name
        assert method["useful_samples"] == result["methods"]["uninterrupted"]["useful_samples"], name
        applied = {e["kind"] for e in method["events"] if "effect" not in e}  # each event, as it was applied
        assert applied == (set() if name == "uninterrupted" else {"slow", "lost"}), (name, method["events"])
    ours = result["methods"]["ours"]
    held_by = [e["what"] for e in ours["events"] if e.get("effect") == "held"]
    assert len(held_by) == 1 and not held_by[0].startswith("0 "), ours["events"]  # the slowdown held the job's ranks
    held = [r["node"] for train in ours["trains"] for r in train["ledger"]["slow_steps_by_rank"] if r["node"]]
    assert held and held[0] == f"node-{slowed.node}", ours["trains"]
    page = Path(ours["reports"]["0"]).read_text()
    compute = re.search(r'<section id="compute">(.*?)</section>', page)[1]
    # "named slow" where the run named it while it trained (three slow windows in a row: slowranks.WINDOWS; held to
    # 0.01 of a core for 25 s, a rank may print fewer -- live naming is drilled in test_slow_rank_local.py)
    assert re.search(rf"node-{slowed.node} rank \d+: (named slow \([\d.]+x the others&#x27; compute\); )?held steps "
                     r"back", compute), compute
    assert (tmp_path / "spotday.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## A spot day, replayed" in (tmp_path / "benchmarks.md").read_text()
    clusters = re.findall(r"^spotday: \w+: cluster (\S+) is up \(MULTINODE_HOME=(\S+?)\)$", res.stdout, re.MULTILINE)
    assert len(clusters) == len(METHODS), res.stdout[-3000:]
    for name, home in clusters:
        assert watch.seen.get(name), f"the watch never saw {name}'s namespaces"
        assert_nothing_left(watch.marks_seen(name, Path(home)))
