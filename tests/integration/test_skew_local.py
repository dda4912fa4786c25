"""Software skew on a real 3-node local cluster: node-2's sessions get another torch first on their path (its
sshd sets PYTHONPATH to a second environment), and the job is refused at pre-flight with one table naming
node-2 and the versions side by side; SKEW=warn prints the table and runs anyway."""

from __future__ import annotations

import pytest
from localcluster import Cluster, another_torch

pytestmark = pytest.mark.integration


@pytest.fixture
def node2_on_other_torch(cluster3: Cluster, tmp_path):
    with another_torch(cluster3, "node-2", tmp_path) as cluster:
        yield cluster


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


def test_the_software_probe_is_kept_on_the_node_until_what_it_read_changes(cluster3: Cluster, tmp_path):
    """The answer is served from the node's cache while PYTHONPATH, PATH and every directory the probe read keep
    their status; a package installed or removed there (an entry added or removed) makes it probe again."""
    import io
    import json
    import os

    from multinode.ssh.runner import RemoteRunner
    from multinode.checks.software import versions_probe

    inv = cluster3.inventory()
    other = tmp_path / "other-env"
    (other / "torch").mkdir(parents=True)
    (other / "torch" / "__init__.py").write_text("")
    version = other / "torch" / "version.py"
    version.write_text("__version__ = '2.12.0+cpu'\n")
    cache = f"{tmp_path}/cache/software.json"
    probe = versions_probe(inv.python, mpi=False, cache=cache)
    with RemoteRunner(inv, out=io.StringIO()) as runner:
        def torch(pythonpath: str = str(other)) -> str:
            res = runner.run_on("node-1", f"PYTHONPATH={pythonpath} {probe}", timeout=60)
            assert res.ok, res.stdout + res.stderr
            return json.loads(res.stdout.strip().splitlines()[-1])["torch"]

        assert torch() == "2.12.0+cpu" and os.path.exists(cache)
        version.write_text("__version__ = '2.11.0+cpu'\n")  # an edit in place: no entry added or removed
        assert torch() == "2.12.0+cpu"  # the kept answer (the documented limit)
        (other / "torch" / "extra.py").write_text("")  # what an install, removal or upgrade does to a directory
        assert torch() == "2.11.0+cpu"
        assert torch(pythonpath=str(tmp_path)) == "2.13.0+cpu"  # another PYTHONPATH: the node's own torch
