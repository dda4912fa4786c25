"""`multinode train` end to end on a real 3-node local cluster: real sshd per node, real torchrun
and mpirun, our trainer and scripts that are not ours; a killed rank and Ctrl-C stop every node."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from localcluster import Cluster

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def summary_of(cluster: Cluster) -> dict:
    return json.loads((cluster.runs()[-1] / "summary.json").read_text())


def assert_no_job_left(cluster: Cluster) -> None:
    assert cluster.job_processes() == {node.name: [] for node in cluster.inventory().nodes}


@pytest.mark.parametrize("mode, nodes, launcher", [("cpu", 2, "auto"), ("mpi", 2, "auto"), ("cpu", 3, "torchrun"),
                                                   ("mpi", 3, "auto")])
def test_digits_trains_across_nodes(shared_cluster3: Cluster, mode: str, nodes: int, launcher: str):
    """cpu: the default (no agents for a fixed-size job) on 2 nodes, torchrun's agents on 3."""
    res = shared_cluster3.cli("train", "--mode", mode, "--nodes", str(nodes), "--launcher", launcher)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    # Rank 0 speaks, the other ranks only warn: the trainer's lines come from node-0 (that every node streams its
    # own ranks' lines is test_torchrun_lines_carry_node_and_rank's, with a script whose every rank prints).
    assert re.search(r"^\[node-0\] \[rank0\]: ", res.stdout, re.M), res.stdout[-2000:]
    if mode == "cpu":
        # The nodes name each other (netns hosts files). Not yet under mpirun: the trainer's MPI rendezvous hosts its
        # store at "0.0.0.0" (training/dist_env.py), an address no resolver names.
        assert "hostname of the client socket" not in res.stdout
        plan = (Path(summary_of(shared_cluster3)["log_dir"]) / "plan.json").read_text()
        assert ("torch.distributed.run" in plan) == (launcher == "torchrun")
    summary = summary_of(shared_cluster3)
    assert summary["exit_codes"] == ({f"node-{i}": 0 for i in range(nodes)} if mode == "cpu" else {"node-0": 0})
    assert summary["world_size"] == nodes
    assert summary["result"]["test_accuracy"] >= 0.95
    assert summary["result"]["world_size"] == nodes
    assert Path(summary["metrics"]).read_text().strip()
    assert "test accuracy: 0." in res.stdout
    assert (Path(summary["log_dir"]) / "node-0.log").read_text()
    for i in range(nodes if mode == "cpu" else 1):  # every node's log is kept, a silent one too
        assert (Path(summary["log_dir"]) / f"node-{i}.log").is_file()
    assert_no_job_left(shared_cluster3)


def test_torchrun_lines_carry_node_and_rank(shared_cluster3: Cluster):
    res = shared_cluster3.cli("train", "--nodes", "2", "--script", str(JOBS / "user_allreduce.py"), "--args=--value 3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    lines = re.findall(r"^\[(node-\d)\] \[rank(\d)\]: USER rank=(\d) world=2 host=(\S+) .* sum=(\d+) expected=(\d+)$",
                       res.stdout, re.M)
    assert len(lines) == 2, res.stdout
    assert {node for node, *_ in lines} == {"node-0", "node-1"}
    for node, prefix_rank, rank, host, total, expected in lines:
        assert prefix_rank == rank and total == expected == "9"
        assert host == f"{shared_cluster3.name}-{node}"  # each node runs under its own hostname
    assert_no_job_left(shared_cluster3)


def test_mpi_mode_runs_a_user_mpi_script(shared_cluster3: Cluster):
    res = shared_cluster3.cli("train", "--mode", "mpi", "--nodes", "3", "--script", str(JOBS / "user_mpi.py"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    hosts = set(re.findall(r"USERMPI rank=\d size=3 host=(\S+) sum=3 expected=3", res.stdout))
    assert hosts == {f"{shared_cluster3.name}-node-{i}" for i in range(3)}, res.stdout
    assert_no_job_left(shared_cluster3)


def test_dry_run_prints_commands_and_runs_nothing(shared_cluster3: Cluster):
    before = shared_cluster3.runs()
    head_ip = shared_cluster3.inventory().head.private_ip
    # The default for a fixed-size job: every node starts its rank with node-0 as MASTER_ADDR.
    res = shared_cluster3.cli("train", "--nodes", "3", "--dry-run")
    assert res.returncode == 0, res.stderr
    argv_lines = [line for line in res.stdout.splitlines() if "] argv: " in line]
    assert len(argv_lines) == 3 and all(line.split("argv: ")[1].startswith("sh -c ") for line in argv_lines)
    assert all(f"[node-{i}] env: MASTER_ADDR={head_ip}" in res.stdout for i in range(3))
    assert "[node-2] env: GLOO_SOCKET_IFNAME=" in res.stdout
    # Through torchrun's agents: c10d rendezvous on node-0.
    res = shared_cluster3.cli("train", "--nodes", "3", "--dry-run", "--launcher", "torchrun")
    assert res.returncode == 0, res.stderr
    argv_lines = [line for line in res.stdout.splitlines() if "] argv: " in line]
    assert len(argv_lines) == 3 and all(f"--rdzv-endpoint={head_ip}:29500" in line for line in argv_lines)
    assert shared_cluster3.runs() == before


class OutputWatcher:
    """Reads a process's stdout in the background so the test can wait for lines."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 120) -> list[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [line for line in list(self.lines) if re.search(pattern, line)]
            if len(found) >= count:
                return found
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in output:\n{''.join(self.lines[-50:])}")


def _start_forever_job(cluster: Cluster):
    proc = cluster.popen("train", "--nodes", "3", "--script", str(JOBS / "user_allreduce.py"), "--args=--steps -1")
    watcher = OutputWatcher(proc)
    for i in range(3):
        watcher.wait_for(rf"^\[node-{i}\] \[rank\d\]: USER step 2 ")
    return proc, watcher


def _worker_pid(cluster: Cluster, node: str) -> int:
    """The node's training worker (not its torchrun agent)."""
    for pid in cluster.job_processes()[node]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        is_python = b"python" in Path(cmdline[0].decode()).name.encode()  # not LAUNCHER=static's sh starter
        if is_python and any(part.endswith(b"user_allreduce.py") for part in cmdline) \
                and b"torch.distributed.run" not in cmdline:
            return pid
    raise AssertionError(f"no worker on {node}")


def test_killed_rank_stops_every_node_and_names_it(shared_cluster3: Cluster):
    import os

    proc, watcher = _start_forever_job(shared_cluster3)
    victim = _worker_pid(shared_cluster3, "node-1")
    rank = int(watcher.wait_for(r"^\[node-1\] \[rank(\d)\]: USER rank=")[0].split("[rank")[1][0])
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=90)
    stderr = proc.stderr.read()
    assert proc.returncode == 1, stderr
    assert f"job failed first on node-1 (rank {rank})" in stderr
    assert "last lines of node-1:" in stderr
    assert summary_of(shared_cluster3)["failed_node"] == "node-1"
    assert_no_job_left(shared_cluster3)


def test_ctrl_c_stops_every_node(shared_cluster3: Cluster):
    proc, watcher = _start_forever_job(shared_cluster3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert proc.returncode == 130, proc.stderr.read()
    assert "stopped on every node" in proc.stderr.read()
    assert_no_job_left(shared_cluster3)


def test_status_shows_every_node_answering(shared_cluster3: Cluster):
    res = shared_cluster3.cli("status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ssh ok") == 3
