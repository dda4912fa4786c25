"""One SSH connection per node for a whole `train` and one session on it (the node's shell), the head included:
the run's claim of the cluster is a command in the head's shell, whose lock a process it leaves holds for as long
as the connection lasts (multinode.backends.claim; it had a session of its own). Counted by each node's own sshd: its
log at LogLevel VERBOSE has a line per accepted connection ("Accepted publickey") and per session started on one
("Starting session:"), whatever the orchestrator believes it opened.

The stall watchdog is off here (STALL_TIMEOUT=0): its polls overlap the job, which holds the node's shell, so they
take a second shell on each node (kept for every later poll) once the job outlasts the first poll interval -- on a
loaded host that made this count 2 on some runs and 1 on others."""

from __future__ import annotations

import contextlib

import pytest
from localcluster import Cluster, sshd_options

pytestmark = pytest.mark.integration

SHORT = "--args=--workload digits --steps-per-epoch 5 2 1"  # 2 epochs of 5 steps, a snapshot after each: no accuracy asserted

NODES = ("node-0", "node-1", "node-2")


def counts(log) -> tuple[int, int]:
    text = log.read_text() if log.exists() else ""
    return text.count("Accepted publickey"), text.count("Starting session:")


def test_a_whole_train_uses_one_connection_and_one_session_per_node_the_claim_included(cluster3: Cluster):
    with contextlib.ExitStack() as stack:
        logs = {node: stack.enter_context(sshd_options(cluster3, node, "LogLevel VERBOSE")) for node in NODES}
        before = {node: counts(log) for node, log in logs.items()}
        res = cluster3.cli("train", "--nodes", "3", "--stall-timeout=0", SHORT, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        during = {node: tuple(a - b for a, b in zip(counts(log), before[node])) for node, log in logs.items()}
    assert all(sum(counts(log)) for log in logs.values()), "sshd logged nothing: LogLevel VERBOSE did not apply"
    assert during == {"node-0": (1, 1), "node-1": (1, 1), "node-2": (1, 1)}, during
    assert cluster3.job_processes() == {node: [] for node in NODES}
