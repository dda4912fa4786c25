"""Throughput's baseline is the seed's hand-typed torchrun, not the orchestrator's own line (issue 38):
bench.throughput builds, from the inventory alone, what the seed's users type on each node, and the recorded
result, whose baseline was the orchestrator's dry-run line, is judged as what it is: its pairs not counted."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

from bench import throughput
from bench.nodes import LocalCluster

# The sitting of 2026-11-24 as docs/benchmarks.json held it before this section was rerun (frozen).
RECORDED = json.loads((Path(__file__).resolve().parent / "fixtures" / "benchmarks-2026-11-24.json").read_text())["throughput"]


def _cluster(make_inv) -> LocalCluster:
    return LocalCluster("dev", home=Path("/state"), nodes=3, _inventory=make_inv(3))


def test_each_node_gets_the_seeds_torchrun_line(make_inv, monkeypatch):
    import multinode.app.run

    def planner_not_used(*a, **k):
        raise AssertionError("the baseline must not come from the orchestrator's planner")

    monkeypatch.setattr(multinode.app.run.Run, "plan", planner_not_used)
    monkeypatch.setattr(LocalCluster, "cli", planner_not_used)  # no `train --dry-run` either
    lines = throughput.seed_lines(_cluster(make_inv), "hand-1", "--workload mlp 4 1000")
    assert list(lines) == ["node-0", "node-1"]
    for i, line in enumerate(lines.values()):
        cd, env, command = line.split(" && ")
        assert cd == f"cd /state/dev/nodes/node-{i}/code" and env == "export OMP_NUM_THREADS=1"
        assert shlex.split(command) == [
            "/repo/.venv/bin/torchrun", "--nproc-per-node=1", "--nnodes=2", f"--node-rank={i}", "--rdzv-id=hand-1",
            "--rdzv-backend=c10d", "--rdzv-endpoint=10.200.7.10:29603", "training/train.py",
            "--metrics-dir", f"/state/dev/nodes/node-{i}/runs/hand-1", "--workload", "mlp", "4", "1000"]
    # none of what our planner adds: no is_host, no --local-addr, no GLOO_SOCKET_IFNAME, no guard, no log dir
    assert not any(word in line for line in lines.values()
                   for word in ("is_host", "--local-addr", "GLOO_SOCKET_IFNAME", "--log-dir", "--max-restarts"))


def test_rank0_metrics_are_read_on_whichever_node_c10d_made_rank_0(make_inv, tmp_path):
    cluster = LocalCluster("dev", home=tmp_path, nodes=2,
                           _inventory=replace(make_inv(2), workdir=str(tmp_path / "{node}")))
    metrics = tmp_path / "node-1" / "runs" / "hand-1" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("")
    assert throughput.rank0_metrics(cluster, "hand-1") == metrics


def test_the_recorded_baseline_was_the_orchestrators_own_line_and_is_not_counted():
    result = RECORDED["result"]
    assert "baseline" not in result and "--rdzv-conf=join_timeout=60,read_timeout=10,is_host=1" in result["head_command"]
    [v] = throughput.judge(result)
    assert v["verdict"] == "inconclusive" and not v["met"] and "runs" not in v and len(v["flagged"]) == 3
    # what that record held, but for the rule's name and the count a side takes (issue 48: the sign test)
    assert {k: x for k, x in v.items() if k not in ("rule", "needed")} == \
        {k: x for k, x in result["verdicts"][0].items() if k != "rule"}
    assert "the line the orchestrator's `--dry-run` prints (recorded before issue 38" in throughput.section(result)
    fresh = throughput.judge({**result, "baseline": throughput.SEED})[0]
    assert fresh["verdict"] == "met" and "flagged" not in fresh and "seed's torchrun" in fresh["claim"]
