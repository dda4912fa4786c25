"""Crash and kill drills: a fault injected into a running 3-node job (a worker or a torchrun agent killed,
a whole node stopped, its link cut, the orchestrator signalled), and faults present before the job starts
(sshd down, the rendezvous unreachable). The job must end non-zero, name node-1 (or exit 128 + the signal
when the orchestrator itself was signalled), and leave no process of ours on any node.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.drills.common import PG_TIMEOUT, REPO, find_pid, watched

JOB = REPO / "tests" / "integration" / "jobs" / "user_allreduce.py"
SELF_EXIT_WAIT = 3 * PG_TIMEOUT  # an isolated node's ranks time out on their own within this


@dataclass
class DrillResult:
    name: str
    exit_code: int
    seconds_to_exit: float
    first_named: str | None  # node named by "job failed first on ..."
    left_at_exit: dict[str, list[int]]
    left_after_recovery: dict[str, list[int]]
    message: str
    seconds_left: float | None = None  # from the orchestrator's exit until nothing of the job was left (None: nothing was)

    @property
    def clean(self) -> bool:
        return not any(self.left_after_recovery.values())


# --- faults: (state, cli process) -> recovery action (or None) --------------------------------

def kill_worker(state, proc):
    os.kill(find_pid(state, "node-1", agent=False), signal.SIGKILL)


def term_agent(state, proc):
    os.kill(find_pid(state, "node-1", agent=True), signal.SIGTERM)


def kill_agent(state, proc):
    os.kill(find_pid(state, "node-1", agent=True), signal.SIGKILL)  # its worker is orphaned


def stop_node(state, proc):
    """Every process of node-1, its sshd included: the machine is gone."""
    from multinode.providers.local.faults import node_pids
    from multinode.providers.local.sshd import start_sshd

    for pid in node_pids(state, "node-1"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return lambda: start_sshd(state, "node-1")


def cut_link(state, proc):
    from multinode.providers.local.faults import set_link

    set_link(state, "node-1", up=False)
    return lambda: set_link(state, "node-1", up=True)


def ctrl_c(state, proc):
    proc.send_signal(signal.SIGINT)


def term_orchestrator(state, proc):
    proc.send_signal(signal.SIGTERM)


def hup_orchestrator(state, proc):
    proc.send_signal(signal.SIGHUP)


DRILLS: dict[str, Callable] = {
    "kill -9 one worker": kill_worker,
    "SIGTERM one node's torchrun agent": term_agent,
    "SIGKILL one node's torchrun agent (orphans its worker)": kill_agent,
    "stop a whole node (every process, sshd included)": stop_node,
    "cut a node's link mid-training": cut_link,
    "Ctrl-C of the orchestrator": ctrl_c,
    "SIGTERM of the orchestrator (a scheduler or a closed session)": term_orchestrator,
    "SIGHUP of the orchestrator (its terminal closed)": hup_orchestrator,
}
# Drills that stop the orchestrator itself: it exits 128 + the signal, having stopped every node.
SIGNALLED = {"Ctrl-C of the orchestrator": 130, "SIGTERM of the orchestrator (a scheduler or a closed session)": 143,
             "SIGHUP of the orchestrator (its terminal closed)": 129}


def run_drill(cluster, name: str) -> DrillResult:
    """``cluster``: an object with ``state``, ``popen(*args)`` and ``job_processes()`` (tests' Cluster)."""
    # The drills hit torchrun's agents too, so they run with them (LAUNCHER=static has its own tests).
    # PYTHONFAULTHANDLER: if the orchestrator ever fails to exit, SIGABRT makes it print every thread's stack.
    proc = cluster.popen("train", "--nodes", "3", "--launcher", "torchrun", "--script", str(JOB),
                         f"--args=--steps -1 --timeout {PG_TIMEOUT}", PYTHONFAULTHANDLER="1")
    with watched(proc) as (out, err):  # after it, every line the orchestrator wrote has been read
        for i in range(3):
            out.wait_for(rf"^\[node-{i}\] \[rank\d\]: USER step 3 ")
        start = time.monotonic()
        recover = DRILLS[name](cluster.state, proc)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            err.join()
            raise RuntimeError(f"{name}: the orchestrator did not exit within 180 s; its stderr and threads:\n"
                               + "".join(err.lines)[-10000:]) from None
        seconds = time.monotonic() - start
    exited = time.monotonic()
    left_at_exit = cluster.job_processes()
    if recover:
        recover()
        end = time.monotonic() + SELF_EXIT_WAIT
        while any(cluster.job_processes().values()) and time.monotonic() < end:
            time.sleep(0.5)
    gone = round(time.monotonic() - exited, 1) if recover and any(left_at_exit.values()) else None
    stderr = "".join(err.lines)
    named = re.search(r"job failed first on (node-\d+)", stderr)
    first_line = next((line.strip() for line in err.lines if line.strip()), "")
    return DrillResult(name, proc.returncode, round(seconds, 1), named[1] if named else None,
                       left_at_exit, cluster.job_processes(), first_line, gone)


# --- drills before the job starts: (state) -> undo; the job must be refused or fail, naming node-1 ----

def sshd_down(state):
    from multinode.providers.local.sshd import start_sshd, stop_sshd

    stop_sshd(state, "node-1")
    return lambda: start_sshd(state, "node-1")


def rendezvous_unreachable(state):
    """node-1's packets to the head vanish (a blackhole route): to its torchrun agent the rendezvous
    endpoint looks exactly like a wrong address. SSH from the control machine still works."""
    from multinode.providers.local import netns as localnet

    inv = state.load_inventory()
    ns = inv.extra["namespaces"][1]
    localnet.run("ip", "-n", ns, "route", "add", "blackhole", f"{inv.head.private_ip}/32")
    return lambda: localnet.run("ip", "-n", ns, "route", "del", "blackhole", f"{inv.head.private_ip}/32")


PRESTART_DRILLS: dict[str, Callable] = {
    "sshd of node-1 down at pre-flight": sshd_down,
    "rendezvous endpoint unreachable from node-1 (as with a wrong endpoint)": rendezvous_unreachable,
}


def run_prestart_drill(cluster, name: str) -> DrillResult:
    undo = PRESTART_DRILLS[name](cluster.state)
    try:
        start = time.monotonic()
        res = cluster.cli("train", "--nodes", "3", "--script", str(JOB), "--args=--steps 3", timeout=240)
        seconds = time.monotonic() - start
        left_at_exit = cluster.job_processes()
    finally:
        undo()
    lines = [line.strip() for line in res.stderr.splitlines() if line.strip()]
    named = re.search(r"job failed first on (node-\d+)", res.stderr) or re.search(r"(node-\d+)", lines[0] if lines else "")
    return DrillResult(name, res.returncode, round(seconds, 1), named[1] if named else None,
                       left_at_exit, cluster.job_processes(), lines[0] if lines else "")
