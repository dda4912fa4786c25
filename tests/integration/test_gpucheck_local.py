"""The GPU smoke test run for real over SSH: local nodes whose inventory claims an NVIDIA GPU each (what
a g4dn node with a broken driver or a CPU-only image looks like from the control machine). The check runs
the nodes' real torch -- a CPU build here -- and `train MODE=gpu` is refused at pre-flight in one line
naming the node, before anything is synced or started. What a real GPU answers is unit-tested on
recorded answers (tests/unit/test_gpucheck.py); no GPU is available here."""

from __future__ import annotations

import dataclasses

import pytest
from localcluster import Cluster

from multinode.core.inventory import Inventory

pytestmark = pytest.mark.integration


def claim_gpus(cluster: Cluster) -> Inventory:
    """Rewrite the cluster's inventory so every node says it has one NVIDIA GPU; return the original."""
    original = cluster.inventory()
    gpus = tuple(dataclasses.replace(n, accelerator="nvidia", accelerator_count=1) for n in original.nodes)
    dataclasses.replace(original, nodes=gpus).save(cluster.state.inventory_path)
    return original


def test_gpu_job_on_nodes_without_a_usable_gpu_is_refused_at_preflight(cluster3: Cluster):
    original = claim_gpus(cluster3)
    runs_before = cluster3.runs()
    try:
        res = cluster3.cli("train", "--mode", "gpu", "--nodes", "2", timeout=240)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2, res.stdout + res.stderr
        assert len(lines) == 1, res.stderr
        assert lines[0].startswith("multinode: node-")
        assert "torch is a CPU-only build (2.13.0+cpu)" in lines[0], lines[0]
        # NPROC beyond the GPUs the inventory records: refused before any SSH.
        res = cluster3.cli("train", "--mode", "gpu", "--nodes", "2", "--nproc", "2", timeout=60)
        assert res.returncode == 2 and "NPROC=2 but node-0 has 1 GPU(s)" in res.stderr, res.stderr
        assert cluster3.runs() == runs_before  # nothing written, nothing started
        assert cluster3.job_processes() == {node.name: [] for node in original.nodes}
    finally:
        original.save(cluster3.state.inventory_path)
