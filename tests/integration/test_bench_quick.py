"""The benchmarks run and write their files (short mode: `make bench QUICK=1`). Numbers are never asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECTIONS = {"collectives", "launch", "control_plane", "throughput", "mpi_vs_ddp", "recovery"}


def test_every_benchmark_runs_and_writes_its_files(tmp_path):
    from leakcheck import NamespaceWatch, assert_nothing_left, require_root

    require_root()  # the benchmark's cluster and its raw baselines need network namespaces

    with NamespaceWatch() as watch:
        res = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out-dir", str(tmp_path)], cwd=REPO,
                             capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert set(data) == SECTIONS
    assert all(entry["quick"] for entry in data.values())
    for name, entry in data.items():  # every section is judged: its target, and met computed from its figures
        result = entry["result"]
        assert isinstance(result["target"], str) and result["target"], name
        assert result["met"] is all(v["met"] for v in result["verdicts"]) and result["verdicts"], name
        assert all(isinstance(v["met"], bool) and v["target"] for v in result["verdicts"]), name
    collectives = data["collectives"]["result"]
    for backend in ("gloo", "mpi"):
        for variant in ("ours", "raw", "one-namespace"):
            assert len(collectives["series"][backend][variant]) == len(collectives["sizes"]), (backend, variant)
    assert set(data["launch"]["result"]["medians"]["2"]) >= {"ours", "pdsh + torchrun", "serial ssh"}
    assert data["throughput"]["result"]["ours_samples_per_s"] > 0
    assert set(data["control_plane"]["result"]["rows"]) == {"2", "4"}  # a cluster of its own per N
    (row,) = data["recovery"]["result"]["rows"].values()  # quick: row (c) alone, one pair
    assert len(row["runs"]["ours"]) == len(row["runs"]["restart"]) == 1, row
    for figures in (row["runs"]["ours"][0], row["runs"]["restart"][0]):  # read from the trainer's sample log
        assert {"steps_lost", "samples_missing", "weights"} <= set(figures), figures
    page = (tmp_path / "benchmarks.md").read_text()
    for heading in ("## Collectives", "## Launch overhead", "## Control plane at scale", "## Training throughput",
                    "## MPI gradient data plane", "## Recovery"):
        assert heading in page
    assert "QUICK mode" in page
    for png in ("collectives.png", "launch.png", "control_plane.png", "throughput.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    # The benchmark's own cluster, the control plane's (one per N) and the recovery section's (one per run): the
    # independent leak check on each.
    clusters = re.findall(r"^(?:control_plane: |recovery: )?cluster (\S+) is up \(.*MULTINODE_HOME=(\S+?)\)$",
                          res.stdout, re.MULTILINE)
    assert len(clusters) == 5, res.stdout
    for name, home in clusters:
        assert watch.seen.get(name), f"the watch never saw {name}'s namespaces"
        assert_nothing_left(watch.marks_seen(name, Path(home)))
