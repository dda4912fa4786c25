"""The link check and `netcheck` on real local nodes, with one node's link throttled for real (tc tbf inside
its namespace): refused at pre-flight naming the node with its figure, run anyway with LINKCHECK=warn (the
summary carries the warning), and the failure summary of LINKCHECK=off shows the node's link figures."""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest
from localcluster import Cluster, bring_up, tear_down

from bench.drills.common import RUN_BOUND, watched

pytestmark = pytest.mark.integration

SHORT = "--args=--workload digits 2 1"  # 2 epochs, a snapshot after each


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), 4, prefix="lc")
    try:
        yield cluster
    finally:
        tear_down(cluster)


@contextlib.contextmanager
def throttled(cluster: Cluster, node: str, burst: str):
    """``node``'s outgoing link through a 20 Mbit/s token bucket of ``burst`` (below the MTU: nothing passes)."""
    ns = cluster.inventory().extra["namespaces"][int(node.split("-")[1])]
    dev = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    iface = next(line.split(":")[1].strip().split("@")[0] for line in dev.splitlines() if "lo:" not in line)
    qdisc = ["ip", "netns", "exec", ns, "tc", "qdisc"]
    subprocess.run([*qdisc, "add", "dev", iface, "root", "tbf", "rate", "20mbit", "burst", burst, "latency", "50ms"],
                   check=True)
    try:
        yield
    finally:
        subprocess.run([*qdisc, "del", "dev", iface, "root"], check=True)


def summary_of(cluster: Cluster) -> dict:
    return json.loads((cluster.runs()[-1] / "summary.json").read_text())


def test_a_throttled_node_is_refused_at_preflight_and_named(cluster4: Cluster):
    before = cluster4.runs()
    with throttled(cluster4, "node-2", "128kb"):
        res = cluster4.cli("train", "--nodes", "3", timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert "link check: node-2: " in lines[0] and "Mbit/s to node-" in lines[0] and "LINKCHECK=warn" in lines[0]
    assert cluster4.runs() == before  # no rank started, no run directory
    assert cluster4.job_processes() == {f"node-{i}": [] for i in range(4)}


def test_with_linkcheck_warn_the_job_runs_and_the_summary_carries_the_warning(cluster4: Cluster):
    with throttled(cluster4, "node-2", "128kb"):
        res = cluster4.cli("train", "--nodes", "3", "--linkcheck", "warn", SHORT, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "warning: link check: node-2: " in res.stdout
    links = summary_of(cluster4)["links"]
    assert links["culprits"] == ["node-2"] and links["verdict"].startswith("node-2: ")
    assert cluster4.job_processes() == {f"node-{i}": [] for i in range(4)}


def test_a_node_whose_cpu_is_starved_is_not_refused_and_the_warning_names_its_cpu(cluster4: Cluster):
    """node-1 has 3 % of a CPU (a cgroup quota on every process of the node, its sshd included, so the link check's
    probe runs under it) while the job passes pre-flight: its links move a few hundred Mbit/s against several
    Gbit/s, which the check before issue 48 refused as a throttled link (a loaded head node would see the same).
    The quota ends once the check has spoken, so the job trains at full speed."""
    from multinode.providers.local.cpuquota import throttled as starved

    with contextlib.ExitStack() as quota:
        assert quota.enter_context(starved(cluster4.state, "node-1", 0.03, whole_node=True)), "node-1 has no process"
        proc = cluster4.popen("train", "--nodes", "3", SHORT)
        with watched(proc) as (out, err):
            out.wait_for(r"link check: ", timeout=RUN_BOUND)
            quota.close()  # the check has spoken: node-1 has its CPU back and the job trains at full speed
            proc.wait(timeout=600)
    text, stderr = "".join(out.lines), "".join(err.lines)
    assert proc.returncode == 0, text[-3000:] + stderr[-3000:]
    assert "warning: link check: node-1's CPU was busy (its probe waited " in text, text[-3000:]
    assert "slow for the CPU its probe had, not for the link (not refused)" in text
    links = summary_of(cluster4)["links"]
    assert links["verdict"] == "ok" and links["starved"], links
    assert all("node-1" in (x["src"], x["dst"]) for x in links["starved"]), links["starved"]
    assert cluster4.job_processes() == {f"node-{i}": [] for i in range(4)}


def test_unthrottled_the_check_passes_and_is_kept_in_the_summary(cluster4: Cluster):
    res = cluster4.cli("train", "--nodes", "4", SHORT, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    links = summary_of(cluster4)["links"]
    assert links["verdict"] == "ok" and len(links["links"]) == 8 and all(x["mbit_s"] for x in links["links"])
    assert "link check" in summary_of(cluster4)["phases"]


def test_a_job_failing_on_a_broken_link_shows_its_figures(cluster4: Cluster):
    with throttled(cluster4, "node-2", "32kbit"):
        res = cluster4.cli("train", "--nodes", "3", "--linkcheck", "off", "--pg-timeout", "10", timeout=600)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    summary = summary_of(cluster4)
    assert summary["links"]["culprits"] == ["node-2"], summary["links"]
    assert "links after the failure: node-2: " in res.stdout + res.stderr
    assert cluster4.job_processes() == {f"node-{i}": [] for i in range(4)}


def test_netcheck_writes_the_matrix_and_the_busbw_table(cluster4: Cluster):
    res = cluster4.cli("netcheck", "--nodes", "4", timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = cluster4.runs()[-1]
    data = json.loads((run / "netcheck.json").read_text())
    assert len(data["pairs"]) == 4 * 3 * 2 and all(p["mbit_s"] for p in data["pairs"]), data["pairs"]
    assert data["allreduce"] and data["allreduce"][0]["ranks"] == 4
    table = (run / "netcheck.md").read_text()
    assert "| from \\ to | node-0 | node-1 | node-2 | node-3 |" in table and "busbw / link" in table
    assert (run / "netcheck.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cluster4.job_processes() == {f"node-{i}": [] for i in range(4)}
