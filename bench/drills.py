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
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(re.search(pattern, line) for line in list(self.lines)):
                return
            time.sleep(0.1)
        raise TimeoutError(f"no {pattern!r} within {timeout} s:\n{''.join(self.lines[-30:])}")


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _find(state, node: str, agent: bool) -> int:
    from multinode.providers.local import job_pids

    for pid in job_pids(state, node):
        cmd = _cmdline(pid)
        is_agent = b"torch.distributed.run" in cmd
        if any(part.endswith(b"user_allreduce.py") for part in cmd) and is_agent == agent:
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
    from multinode.providers.local import node_pids, start_sshd

    for pid in node_pids(state, "node-1"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return lambda: start_sshd(state, "node-1")


def cut_link(state, proc):
    from multinode.providers.local import set_link

    set_link(state, "node-1", up=False)
    return lambda: set_link(state, "node-1", up=True)


def ctrl_c(state, proc):
    proc.send_signal(signal.SIGINT)


DRILLS: dict[str, Callable] = {
    "kill -9 one worker": kill_worker,
    "SIGTERM one node's torchrun agent": term_agent,
    "SIGKILL one node's torchrun agent (orphans its worker)": kill_agent,
    "stop a whole node (every process, sshd included)": stop_node,
    "cut a node's link mid-training": cut_link,
    "Ctrl-C of the orchestrator": ctrl_c,
}


def run_drill(cluster, name: str) -> DrillResult:
    """``cluster``: an object with ``state``, ``popen(*args)`` and ``job_processes()`` (tests' Cluster)."""
    proc = cluster.popen("train", "--nodes", "3", "--script", str(JOB), f"--args=--steps -1 --timeout {PG_TIMEOUT}")
    out, err = Watcher(proc.stdout), Watcher(proc.stderr)
    try:
        for i in range(3):
            out.wait_for(rf"^\[node-{i}\] \[rank\d\]: USER step 3 ")
        start = time.monotonic()
        recover = DRILLS[name](cluster.state, proc)
        proc.wait(timeout=180)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.3)  # let the reader threads drain
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


def markdown(results: list[DrillResult]) -> str:
    lines = [
        "# Reliability drills",
        "",
        f"Measured by `python -m bench.drills` on {datetime.now(timezone.utc):%Y-%m-%d} on this machine "
        f"({os.cpu_count()} cores), local cluster of 3 nodes (network namespaces, sshd per node), "
        f"torchrun c10d, gloo, process-group timeout {PG_TIMEOUT} s, no restarts. The fault hits node-1 "
        "(or the orchestrator) after every node has done a few all_reduce steps.",
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
            results = []
            for name in DRILLS:
                if args.only and not any(part in name for part in args.only):
                    continue
                result = run_drill(cluster, name)
                print(f"{name}: exit {result.exit_code} in {result.seconds_to_exit} s, named {result.first_named}, "
                      f"left after recovery {sum(map(len, result.left_after_recovery.values()))}", flush=True)
                results.append(result)
        finally:
            tear_down(cluster)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
