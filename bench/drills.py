"""Failure drills on a real local cluster: inject a fault into a running job, measure how long the
job takes to end, and count the processes of ours left on every node.

    python -m bench.drills [--out docs/reliability.md]     (brings a 3-node cluster up and down)

Every drill runs the same job through the real CLI (a user script doing an all_reduce every 0.2 s
on 3 nodes, ``--pg-timeout 10``), waits until every node has done a few steps, injects the fault
into node-1 (or the orchestrator), and records: exit code, seconds from the fault to the
orchestrator's exit, which node the error names first, and the processes left on each node once
the orchestrator has exited (and, for faults that isolate a node, once the node is reachable again).
The integration tests (tests/integration/test_drills.py) run the same drills and assert on
outcomes; timings are only reported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "integration" / "jobs" / "user_allreduce.py"
PG_TIMEOUT = 10
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

    @property
    def clean(self) -> bool:
        return not any(self.left_after_recovery.values())


class Watcher:
    def __init__(self, stream):
        self.lines: list[str] = []
        self.times: list[float] = []  # time.monotonic() at which each line arrived

        def read() -> None:
            for line in stream:
                self.times.append(time.monotonic())
                self.lines.append(line)

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30) -> None:
        """Until the stream's end has been read (the process has exited and closed it), with a deadline."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"output still open {timeout} s after the process exited")

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, re.Match] | None:
        """(arrival time, match) of the first line matching ``pattern`` that arrived after ``after``."""
        for when, line in zip(list(self.times), list(self.lines)):
            match = re.search(pattern, line)
            if when >= after and match:
                return when, match
        return None

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(re.search(pattern, line) for line in list(self.lines)):
                return
            time.sleep(0.1)
        raise TimeoutError(f"no {pattern!r} within {timeout} s:\n{''.join(self.lines[-30:])}")


@contextlib.contextmanager
def watched(proc: subprocess.Popen):
    """(out, err): Watchers of a CLI process's stdout and stderr. Leaving the block kills the process if it still
    runs; leaving it normally also waits until both streams have been read to their end."""
    out, err = Watcher(proc.stdout), Watcher(proc.stderr)
    try:
        yield out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.join(), err.join()


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _find(state, node: str, agent: bool, script: bytes = b"user_allreduce.py") -> int:
    from multinode.providers.local.faults import job_pids

    for pid in job_pids(state, node):
        cmd = _cmdline(pid)
        is_agent = b"torch.distributed.run" in cmd
        if any(part.endswith(script) for part in cmd) and is_agent == agent:
            return pid
    raise RuntimeError(f"no {'torchrun agent' if agent else 'worker'} on {node}")


# --- faults: (state, cli process) -> recovery action (or None) --------------------------------

def kill_worker(state, proc):
    os.kill(_find(state, "node-1", agent=False), signal.SIGKILL)


def term_agent(state, proc):
    os.kill(_find(state, "node-1", agent=True), signal.SIGTERM)


def kill_agent(state, proc):
    os.kill(_find(state, "node-1", agent=True), signal.SIGKILL)  # its worker is orphaned


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
    left_at_exit = cluster.job_processes()
    if recover:
        recover()
        end = time.monotonic() + SELF_EXIT_WAIT
        while any(cluster.job_processes().values()) and time.monotonic() < end:
            time.sleep(0.5)
    stderr = "".join(err.lines)
    named = re.search(r"job failed first on (node-\d+)", stderr)
    first_line = next((line.strip() for line in err.lines if line.strip()), "")
    return DrillResult(name, proc.returncode, round(seconds, 1), named[1] if named else None,
                       left_at_exit, cluster.job_processes(), first_line)


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


# --- elastic drills: MAX_RESTARTS=1, our trainer with snapshots; the job must finish ------------

ELASTIC_EPOCHS, SAVE_EVERY = 40, 4
FAULT_AFTER_EPOCH = 9  # rank 0 has printed "epoch 9/40": epochs 0..8 are done, the last snapshot holds next epoch 8


@dataclass
class ElasticResult:
    name: str
    exit_code: int
    test_accuracy: float | None
    epochs_done_at_fault: int  # epochs rank 0 had finished when the fault hit
    resumed_from: int | None  # the next epoch of the snapshot the job resumed from
    seconds_to_resume: float | None  # fault -> rank 0 says it resumed
    wall_seconds: float
    left_at_exit: dict[str, list[int]]

    @property
    def epochs_lost(self) -> int | None:
        return None if self.resumed_from is None else self.epochs_done_at_fault - self.resumed_from


def elastic_kill_worker(state, proc):
    os.kill(_find(state, "node-1", agent=False, script=b"train.py"), signal.SIGKILL)


def elastic_restart_node(state, proc):
    """Every process of node-1, its sshd included, dies; the node is back (sshd answers) 2 s later."""
    bring_back = stop_node(state, proc)
    time.sleep(2.0)  # the node's downtime: the fault itself, not a wait for anything
    bring_back()


SNAPSHOT_CRASH_EPOCH = 11  # rank 0 dies writing the snapshot of epoch 12 (next epoch 12): the one of 8 must serve

ELASTIC_DRILLS: dict[str, tuple[Callable | None, tuple[str, ...]]] = {
    "kill -9 one worker, MAX_RESTARTS=1": (elastic_kill_worker, ()),
    "node-1 dies and comes back 2 s later, MAX_RESTARTS=1": (elastic_restart_node, ()),
    "rank 0 killed while writing a snapshot, MAX_RESTARTS=1": (None, ("--crash-during-snapshot", str(SNAPSHOT_CRASH_EPOCH))),
}


def run_elastic_drill(cluster, name: str) -> ElasticResult:
    """Our digits trainer on 3 nodes with MAX_RESTARTS=1 and a snapshot every 4 epochs; the fault hits
    node-1 after epoch 9 (or rank 0 mid-write of a snapshot); the job must finish, resumed from its last
    complete snapshot, with the accuracy target met."""
    fault_fn, extra = ELASTIC_DRILLS[name]
    args = " ".join(("--workload", "digits", str(ELASTIC_EPOCHS), str(SAVE_EVERY), *extra))
    begin = time.monotonic()
    proc = cluster.popen("train", "--nodes", "3", "--max-restarts", "1", f"--args={args}")
    with watched(proc) as (out, err):
        if fault_fn is not None:
            out.wait_for(rf"\[rank0\]: epoch {FAULT_AFTER_EPOCH}/{ELASTIC_EPOCHS} ", timeout=180)
            fault = time.monotonic()
            fault_fn(cluster.state, proc)
        else:  # the trainer hurts itself: the fault is the end of the epoch whose snapshot it dies writing
            hit = rf"\[rank0\]: epoch {SNAPSHOT_CRASH_EPOCH + 1}/{ELASTIC_EPOCHS} "
            out.wait_for(hit, timeout=180)
            fault = out.first(hit)[0]
        proc.wait(timeout=240)
    done = max(int(m[1]) for when, line in zip(out.times, out.lines) if when <= fault
               for m in [re.search(r"\[rank0\]: epoch (\d+)/", line)] if m)
    resumed = out.first(r"resumed from snapshot: next epoch (\d+)", after=fault)
    accuracy = out.first(r"^\s*test accuracy: ([0-9.]+)")
    return ElasticResult(name, proc.returncode, float(accuracy[1][1]) if accuracy else None, done,
                         int(resumed[1][1]) if resumed else None,
                         round(resumed[0] - fault, 1) if resumed else None,
                         round(time.monotonic() - begin, 1), cluster.job_processes())


def markdown(results: list[DrillResult], elastic: list[ElasticResult] = ()) -> str:
    lines = [
        "# Reliability drills",
        "",
        f"Measured by `python -m bench.drills` on {datetime.now(timezone.utc):%Y-%m-%d} on this machine "
        f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} when the page was written), local "
        f"cluster of 3 nodes (network namespaces, sshd per node), torchrun c10d, gloo, process-group timeout "
        f"{PG_TIMEOUT} s, rendezvous read timeout 10 s, no restarts. The fault hits node-1 (or the orchestrator) "
        "after every node has done a few all_reduce steps; for the faults present before the job starts "
        "(sshd down, rendezvous unreachable) the seconds run from the command to its exit.",
        "",
        "| drill | exit | seconds to exit | first node named | processes left at exit | left after recovery |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for r in results:
        at_exit = sum(len(v) for v in r.left_at_exit.values())
        after = sum(len(v) for v in r.left_after_recovery.values())
        lines.append(f"| {r.name} | {r.exit_code} | {r.seconds_to_exit:.1f} | {r.first_named or '-'} | {at_exit} | {after} |")
    lines += [
        "",
        "Seconds to exit run from the fault to the orchestrator's exit: detection, stopping every node, and",
        "(for a node that stopped answering) the bounded wait for its SSH session before it is dropped.",
        "A node cut off from the network cannot be reached to be stopped; its ranks end on their own when",
        "their process-group timeout expires, which the 'left after recovery' column checks.",
    ]
    if elastic:
        lines += [
            "",
            "## With restarts (elastic)",
            "",
            f"Our digits trainer on 3 nodes, `MAX_RESTARTS=1`, {ELASTIC_EPOCHS} epochs with a snapshot every "
            f"{SAVE_EVERY}; the fault hits node-1 once rank 0 has finished epoch {FAULT_AFTER_EPOCH}. A killed worker is "
            "restarted by its node's torchrun agent; a node that dies is started again by the orchestrator once it "
            "answers SSH (its peers' agents keep the rendezvous open), and every rank resumes from the freshest snapshot.",
            "",
            "| drill | exit | test accuracy | epochs done at fault | resumed from epoch | epochs lost (max "
            f"{SAVE_EVERY}) | seconds fault -> resumed | wall (s) | processes left |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in elastic:
            acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
            lines.append(f"| {r.name} | {r.exit_code} | {acc} | {r.epochs_done_at_fault} | "
                         f"{'-' if r.resumed_from is None else r.resumed_from} | "
                         f"{'-' if r.epochs_lost is None else r.epochs_lost} | "
                         f"{'-' if r.seconds_to_resume is None else r.seconds_to_resume} | {r.wall_seconds} | "
                         f"{sum(len(v) for v in r.left_at_exit.values())} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--only", action="append", help="run only drills whose name contains this")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from localcluster import bring_up, tear_down

    with tempfile.TemporaryDirectory() as home:
        cluster = bring_up(Path(home), 3, prefix="drill")
        try:
            def run_each(drills, run) -> list:
                done = []
                for name in drills:
                    if not args.only or any(part in name for part in args.only):
                        done.append(run(cluster, name))
                        print(f"{name}: {done[-1]}", flush=True)
                return done

            results = run_each(DRILLS, run_drill) + run_each(PRESTART_DRILLS, run_prestart_drill)
            elastic = run_each(ELASTIC_DRILLS, run_elastic_drill)
            from bench.hang_drills import HANG_DRILLS, run_hang_drill

            hangs = run_each(HANG_DRILLS, run_hang_drill)
        finally:
            tear_down(cluster)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from bench.hang_drills import markdown as hang_markdown

    args.out.write_text(markdown(results, elastic) + hang_markdown(hangs))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
