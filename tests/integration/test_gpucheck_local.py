"""The GPU smoke test run for real over SSH: local nodes whose inventory claims GPUs (what a g4dn or g4ad
node looks like from the control machine), and `train MODE=gpu` refused at pre-flight in one line naming the
node, before anything is synced or started.

* With the nodes' real torch -- a CPU build here -- the check says so.
* With a stand-in torch first on the nodes' PYTHONPATH (tests/integration/standin_torch: a CUDA or ROCm build
  as the smoke check sees it, its errors for a GPU without kernels written by us after texts in public reports,
  not produced by a real build), the check's GPU branch runs: architecture detection, the matmul, the reduction,
  the "no kernel image" match, rocBLAS's abort. Every line asserted below is the real check's, run over SSH; no
  GPU is available here. The real outputs, as users posted them, are tests/unit/fixtures/gpu_refusals/
  (tests/unit/test_gpu_refusals.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
from localcluster import Cluster

from multinode.core.inventory import Inventory

pytestmark = pytest.mark.integration


STANDIN = Path(__file__).resolve().parent / "standin_torch"


def claim_gpus(cluster: Cluster, accelerator: str = "nvidia", count: int = 1) -> Inventory:
    """Rewrite the cluster's inventory so every node says it has ``count`` GPUs; return the original."""
    original = cluster.inventory()
    gpus = tuple(dataclasses.replace(n, accelerator=accelerator, accelerator_count=count) for n in original.nodes)
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


@contextlib.contextmanager
def standin_gpus(cluster: Cluster, gpus: dict[str, dict], root: Path):
    """Each node's SSH sessions import the stand-in torch, describing the node's GPUs as ``gpus[node]`` says
    (sshd's SetEnv: PYTHONPATH and MULTINODE_STANDIN_GPU, the path of a JSON file), until the block ends."""
    from multinode.providers.local.meta import node_dir
    from multinode.providers.local.sshd import start_sshd, stop_sshd

    originals = {}
    for node, gpu in gpus.items():
        spec = root / f"{node}.json"
        spec.write_text(json.dumps(gpu))
        config = node_dir(cluster.state, node) / "sshd_config"
        originals[node] = config.read_text()
        # sshd keeps an option's first value: ours goes first.
        config.write_text(f"SetEnv PYTHONPATH={STANDIN} MULTINODE_STANDIN_GPU={spec}\n" + originals[node])
        stop_sshd(cluster.state, node)
        start_sshd(cluster.state, node)
    try:
        yield
    finally:
        for node, text in originals.items():
            (node_dir(cluster.state, node) / "sshd_config").write_text(text)
            stop_sshd(cluster.state, node)
            start_sshd(cluster.state, node)


T4 = {"torch": "2.13.0", "cuda": "13.0", "count": 1, "name": "Tesla T4", "arch": "sm_75", "built": ["sm_75", "sm_80", "sm_90"]}
V520 = {"torch": "2.13.0+rocm7.2", "cuda": None, "hip": "7.2.53211", "count": 1, "name": "AMD Radeon Pro V520",
        "arch": "gfx1011", "built": ["gfx90a", "gfx942", "gfx1100"], "blas": ["gfx90a", "gfx942", "gfx1100"]}

STANDIN_CASES = [
    # PyTorch's CUDA build without sm_75 (a build for newer GPUs only): torch's first kernel on the T4.
    ("nvidia", 1, 1, {**T4, "built": ["sm_80", "sm_90"]},
     "node-1: the node's torch has no kernels for sm_75 (Tesla T4); it was built for sm_80, sm_90: use a build for sm_75 "
     "(docker/README.md)"),
    # The official ROCm wheel on a V520: rocBLAS has no gfx1011 library and aborts the process at the matmul.
    ("amd", 1, 1, V520,
     "node-1: the node's torch has no kernels for gfx1011 (AMD Radeon Pro V520): rocBLAS aborted at the first matmul "
     "(it has kernels for gfx90a, gfx942, gfx1100); use a build for gfx1011 (docker/README.md)"),
    # rocBLAS built for gfx1011 but torch not: torch's own HIP kernel (the reduction's fill) is missing.
    ("amd", 1, 1, {**V520, "blas": ["gfx1011"]},
     "node-1: the node's torch has no kernels for gfx1011 (AMD Radeon Pro V520); it was built for gfx90a, gfx942, gfx1100: "
     "use a build for gfx1011 (docker/README.md)"),
    # A CUDA build that sees no GPU (no driver in reach).
    ("nvidia", 1, 1, {**T4, "count": 0},
     "node-1: no NVIDIA driver visible in the container (torch 2.13.0 with CUDA 13.0 sees no GPU; devices: none)"),
    # The inventory says 2 GPUs, the node shows torch 1: NPROC=2 passes planning and is refused by the node.
    ("nvidia", 2, 2, T4, "node-1: NPROC=2 but the node has 1 GPU(s); use NPROC=1 or fewer (or NPROC=auto)"),
    # A GPU that computes a wrong product.
    ("nvidia", 1, 1, {**T4, "wrong": True}, "node-1: a matmul on GPU 0 (Tesla T4) gave a wrong result (max error 3.0)"),
]


@pytest.mark.parametrize("accelerator, count, nproc, gpu, expected", STANDIN_CASES)
def test_the_smoke_checks_gpu_branch_names_the_node_and_the_cause(cluster3: Cluster, tmp_path, accelerator, count,
                                                                   nproc, gpu, expected):
    """node-0 has a healthy GPU (the stand-in passes it), node-1 the fault: the line is the real check's."""
    healthy = T4 if accelerator == "nvidia" else {**V520, "built": ["gfx1011"], "blas": ["gfx1011"]}
    original = claim_gpus(cluster3, accelerator, count)
    runs_before = cluster3.runs()
    try:
        with standin_gpus(cluster3, {"node-0": {**healthy, "count": count}, "node-1": gpu}, tmp_path):
            res = cluster3.cli("train", "--mode", "gpu", "--nodes", "2", "--nproc", str(nproc), timeout=240)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2, res.stdout + res.stderr
        assert lines == [f"multinode: {expected}"], res.stderr
        assert cluster3.runs() == runs_before
        assert cluster3.job_processes() == {node.name: [] for node in original.nodes}
    finally:
        original.save(cluster3.state.inventory_path)
