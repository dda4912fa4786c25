"""Software skew on a real 3-node local cluster: node-2's sessions get another torch first on their path (its
sshd sets PYTHONPATH to a second environment), and the job is refused at pre-flight with one table naming
node-2 and the versions side by side; SKEW=warn prints the table and runs anyway."""

from __future__ import annotations

import pytest
from localcluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def node2_on_other_torch(cluster3: Cluster, tmp_path):
    from multinode.providers.local import _node_dir, start_sshd, stop_sshd

    fake = tmp_path / "other-env" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this torch is only a version file')\n")
    (fake / "version.py").write_text("__version__ = '2.12.0+cpu'\ncuda = None\nhip = None\n")
    config = _node_dir(cluster3.state, "node-2") / "sshd_config"
    original = config.read_text()
    config.write_text(f"SetEnv PYTHONPATH={fake.parent}\n" + original)  # sshd keeps an option's first value
    stop_sshd(cluster3.state, "node-2")
    start_sshd(cluster3.state, "node-2")
    try:
        yield cluster3
    finally:
        config.write_text(original)
        stop_sshd(cluster3.state, "node-2")
        start_sshd(cluster3.state, "node-2")


JOB = str(__import__("pathlib").Path(__file__).parent / "jobs" / "user_allreduce.py")


def test_a_node_with_another_torch_is_refused_and_named(node2_on_other_torch: Cluster):
    cluster = node2_on_other_torch
    runs_before = cluster.runs()
    res = cluster.cli("train", "--nodes", "3", "--script", JOB,
                      "--args=--steps 1", timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "node-2 runs other software than node-0 (torch 2.12.0+cpu vs 2.13.0+cpu)" in res.stderr, res.stderr
    table = [line.split() for line in res.stderr.splitlines() if line.startswith("  node")]
    assert table == [["node", "torch"], ["node-0", "2.13.0+cpu"], ["node-2", "2.12.0+cpu"]], res.stderr
    assert "SKEW=warn runs anyway" in res.stderr and "Traceback" not in res.stderr
    assert cluster.runs() == runs_before and not any(cluster.job_processes().values())

    warned = cluster.cli("train", "--nodes", "3", "--skew", "warn", "--pg-timeout", "10", "--script",
                         JOB, "--args=--steps 1 --timeout 10",
                         timeout=180)
    assert "node-2 runs other software than node-0" in warned.stderr and "SKEW=warn: running anyway" in warned.stderr
    # It ran: node-2's ranks could not import that torch, and the job failed naming node-2.
    assert warned.returncode == 1 and "job failed first on node-2" in warned.stderr, warned.stdout + warned.stderr
    assert not any(cluster.job_processes().values())
