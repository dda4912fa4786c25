"""Hang drills: one rank of a running 3-node job stops making progress without failing, and the
orchestrator must name it (node, rank, why, top of its stack) -- not the ranks that time out waiting for it.

    python -m bench.drills [--only hang]      (these run with the other drills, into docs/reliability.md)

Each drill runs tests/integration/jobs/user_hang.py through the real CLI on 3 nodes with a process-group
timeout of PG_TIMEOUT seconds; rank 2 (on node-2) hangs after a few steps: SIGSTOPped from outside, spinning
in a Python loop, or blocked on a lock right before its next collective -- or rank 0 (on node-0) calls
all_reduce while ranks 1-2 call broadcast (every rank waits; the stall watchdog ends the job). Recorded: exit
code, seconds from the hang to the orchestrator's exit (bound: the detecting timeout + 10), the node and rank
named, the root-cause line, and the processes left on every node.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.drills.common import PG_TIMEOUT, REPO, watched
from bench.verdicts import Target, paired

HANG_JOB = REPO / "tests" / "integration" / "jobs" / "user_hang.py"
HANG_AFTER = 3  # steps before rank 2 hangs


@dataclass
class HangResult:
    name: str
    exit_code: int
    seconds_to_exit: float  # from the hang to the orchestrator's exit
    named_node: str | None
    named_rank: int | None
    root_cause: str  # the summary's "root cause:" line
    stacks: str | None  # where the stacks were saved
    capture_seconds: float | None  # how long the capture before the gang-stop took
    left_at_exit: dict[str, list[int]]


def rank_pid(state, node: str, rank: int) -> int:
    """The Python process of ``rank`` on ``node`` (its environment says RANK=<rank>, or under mpirun
    OMPI_COMM_WORLD_RANK=<rank>)."""
    from multinode.providers.local.faults import job_pids

    for pid in job_pids(state, node):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if {f"RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()} & set(env) and b"python" in exe:
            return pid
    raise RuntimeError(f"no rank {rank} on {node}")


def sigstop(state) -> None:
    os.kill(rank_pid(state, "node-2", 2), signal.SIGSTOP)


@dataclass(frozen=True)
class HangDrill:
    how: str  # how the rank hangs in the job (user_hang.py --how)
    fault: Callable | None  # what the drill does from outside once the rank did HANG_AFTER steps
    evidence: tuple[str, ...]  # what the root-cause line must say
    pg_timeout: int = PG_TIMEOUT
    stall_timeout: int = 0  # STALL_TIMEOUT (0: off, the process-group timeout ends the job)
    rank: int = 2  # the rank that hangs, on node-<rank> (one rank per node): the one to name

    @property
    def node(self) -> str:
        return f"node-{self.rank}"

    @property
    def bound(self) -> int:
        """The requirement: the job ends within the timeout that detects the hang + 10 s."""
        return (self.stall_timeout or self.pg_timeout) + 10


STALL_TIMEOUT = 8
HANG_DRILLS: dict[str, HangDrill] = {
    "hang: rank 2 on node-2 SIGSTOPped mid-training": HangDrill("none", sigstop, ("is stopped (state T", "user_hang.py")),
    "hang: rank 2 on node-2 spins in a Python loop, the others wait in all_reduce":
        HangDrill("spin", None, ("is running outside any collective", "(state R)", "spin_forever (project/user_hang.py:")),
    "hang: rank 2 on node-2 blocked on a lock before a collective":
        HangDrill("lock", None, ("is blocked outside any collective", "(state S", "wait_for_the_lock (project/user_hang.py:")),
    f"hang: rank 2 on node-2 SIGSTOPped, process-group timeout 600 s, STALL_TIMEOUT={STALL_TIMEOUT}":
        HangDrill("none", sigstop, ("is stopped (state T", "user_hang.py"), pg_timeout=600, stall_timeout=STALL_TIMEOUT),
    # Every rank waits, each in a collective: no process state or timeout tells them apart, only the collective
    # on their stacks. The process-group timeout would fire on every rank at once (and take the stacks with it):
    # the stall watchdog ends the job while they still wait.
    f"hang: rank 0 on node-0 calls all_reduce, ranks 1-2 call broadcast, STALL_TIMEOUT={STALL_TIMEOUT}":
        HangDrill("mismatch", None, ("is the odd one out: rank 0 in all_reduce, ranks 1-2 in broadcast: the ranks "
                                     "called different collectives", "all_reduce (torch/distributed/"),
                  pg_timeout=600, stall_timeout=STALL_TIMEOUT, rank=0),
}


def judge(name: str, seconds_to_exit: float) -> dict:
    """The drill's requirement judged by the one rule of bench.verdicts: seconds from the hang to the
    orchestrator's exit, at most the detecting timeout + 10 s (:attr:`HangDrill.bound`)."""
    return paired(f"{name}: seconds to exit", [("run", seconds_to_exit)], Target("<=", HANG_DRILLS[name].bound),
                  "runs")


def run_hang_drill(cluster, name: str) -> HangResult:
    drill = HANG_DRILLS[name]
    fault = drill.fault
    args = f"--hang-rank {drill.rank} --how {drill.how} --after {HANG_AFTER} --timeout {drill.pg_timeout}"
    proc = cluster.popen("train", "--nodes", "3", "--script", str(HANG_JOB), f"--args={args}",
                         f"--stall-timeout={drill.stall_timeout}", PYTHONFAULTHANDLER="1")
    with watched(proc) as (out, err):
        if fault is not None:
            out.wait_for(rf"^\[{drill.node}\] \[rank{drill.rank}\]: USER step {HANG_AFTER} ", also=err)
            start = time.monotonic()
            fault(cluster.state)
        else:
            out.wait_for(rf"^\[{drill.node}\] \[rank{drill.rank}\]: USER rank={drill.rank} .* hangs now", also=err)
            start = out.first(r"hangs now")[0]
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            raise RuntimeError(f"{name}: the orchestrator did not exit within 120 s:\n" + "".join(err.lines)[-8000:]) from None
        seconds = time.monotonic() - start
    stderr, stdout = "".join(err.lines), "".join(out.lines)
    named = re.search(r"job failed first on (node-\d+) \(rank (\d+)\)", stderr)
    cause = re.search(r"^\s*root cause: (.*)$", stderr, re.MULTILINE)
    stacks = re.search(r"^\s*stacks at failure: (\S+)/", stderr, re.MULTILINE)
    took = re.search(r"captured the stacks of \d+ live rank\(s\) in ([0-9.]+) s", stdout)
    return HangResult(name, proc.returncode, round(seconds, 1), named[1] if named else None,
                      int(named[2]) if named else None, cause[1] if cause else stderr[-3000:],
                      stacks[1] if stacks else None, float(took[1]) if took else None, cluster.job_processes())
