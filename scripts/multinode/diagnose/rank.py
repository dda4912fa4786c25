"""Which rank really failed: the root-cause ranking. Pure, apart from reading the nodes' logs.

A hung rank does not fail: its peers do, when their collective times out, and their logs all say
"timed out". Only the live ranks (:mod:`multinode.diagnose.capture`) can tell which one they were waiting for.

* :func:`waiting`: is a stack inside a collective, a store or rendezvous wait, or DDP's all-reduce?
* :func:`pick_culprit` names the rank that is not waiting on its peers: stopped, then uninterruptible,
  then stuck in the same place outside any collective or store wait in every sample (running: state R
  or busy; blocked: on the very same line in every look). A rank inside a collective is never the
  culprit: it is waiting for the culprit. None when no live rank qualifies.
* :func:`own_failure` / :func:`pick_root_cause`: among the nodes that failed (NodeErrors, in the order
  they ended), the first whose log does not read like a reaction to another node's failure
  (:data:`PEER_FAILURE`) -- for the failed node's name, when every one reads so, the first with a rank killed by
  a signal (:func:`killed_rank`). Only a node's failure counts (:func:`is_node_failure`: it carries
  the node's exit code or its log); a stop the run made itself -- the stall watchdog's, the deadline's -- names
  the head but says nothing of any node, and is never "a node that failed on its own".
* :func:`odd_collective`: when the live ranks wait in different collectives, the odd one out.
* :func:`root_cause` weighs them: a stopped or uninterruptible rank; else the odd one out of mismatched
  collectives; else none when a node failed on its own (the caller names that node from its log); else a rank
  stuck outside any collective. A stalled job (no node failed; the run stopped it) is named from the capture
  alone: ``root_cause(dumps)``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from multinode.diagnose.collectives import mismatch
from multinode.diagnose.dumps import Frame, RankDump

# A frame in one of these files means the rank is inside a collective, a store or rendezvous wait, or
# DDP's gradient all-reduce (which torch runs from the autograd engine during backward).
WAIT_FILE = re.compile(r"torch/distributed/|torch/nn/parallel/distributed\.py|torch/autograd/|/mpi4py/")
# A frame whose current line calls a collective or waits on a request (torch.distributed, mpi4py).
WAIT_CODE = re.compile(
    r"\.(all_reduce|allreduce|Allreduce|Iallreduce|all_gather\w*|allgather|Allgather|reduce_scatter\w*|"
    r"Reduce_scatter\w*|broadcast\w*|bcast|Bcast|barrier|Barrier|monitored_barrier|all_to_all\w*|alltoall|Alltoall|"
    r"Send|Recv|Sendrecv|isend|irecv|wait|Wait|Waitall|waitall)\s*\(|\bstore\.(get|wait)\s*\(")
WAIT_NAME = re.compile(r"all_?reduce|allgather|all_gather|barrier|broadcast|reduce_scatter", re.IGNORECASE)
# A process on its way out (its own error printed, interpreter shutting down) is not stuck anywhere.
EXITING = re.compile(r"^(_shutdown|excepthook|_run_exitfuncs|print_exception|format_exception)$")


def waiting(frames: Iterable[Frame]) -> bool:
    """Is the rank inside a collective, a store wait or DDP's all-reduce (waiting on its peers)?"""
    return any(WAIT_FILE.search(f.file) or WAIT_CODE.search(f.code) or WAIT_NAME.search(f.name) for f in frames)


BUSY_TICKS = 25  # main-thread CPU ticks (1/100 s) between the two looks that make a rank "running"


def verdict(dump: RankDump) -> tuple[int, str] | None:
    """(priority, why) when this rank is not waiting on its peers; None when it is, or is gone or exiting."""
    alive = [s for s in dump.samples if s.state is not None]
    if not alive or dump.parent_is_rank:
        return None
    if any(s.state in ("T", "t") for s in alive):
        return 0, "is stopped (state T: SIGSTOP, a debugger or job control); its peers wait for it in their collectives"
    if len(alive) >= 2 and all(s.state == "D" for s in alive):
        # Two looks: a rank reading its files (importing torch) is in D for moments at a time, and one look at it
        # then outranked a node that had failed on its own (seen on a loaded machine).
        return 1, "is in uninterruptible sleep (state D: blocked in the kernel -- I/O, a device or its driver)"
    if len(dump.samples) < 2 or len(alive) < len(dump.samples) or any(not s.frames or s.error for s in alive):
        return None  # one look cannot tell stuck from passing through; gone before the last look; no stack
    if any(waiting(s.frames) or any(EXITING.match(f.name) for f in s.frames) for s in alive):
        return None
    if len({(s.frames[0].name, s.frames[0].file) for s in alive}) != 1:
        return None  # moving on between looks: not stuck
    state = alive[-1].state
    busy = len(alive) > 1 and alive[-1].cpu_ticks - alive[0].cpu_ticks >= BUSY_TICKS
    if all(s.state == "R" for s in alive) or busy:
        return 2, "is running outside any collective or store wait (state R) while its peers wait for it"
    if len({s.frames[0].line for s in alive}) != 1:
        return None  # a blocked thread cannot move from its line: this one is moving (a loop with a sleep)
    return 3, (f"is blocked outside any collective or store wait (state {state}: a lock, a queue, I/O) "
               f"while its peers wait for it")


STRONG = 1  # verdicts up to this priority (stopped, uninterruptible) outrank what the logs say


@dataclass(frozen=True)
class Culprit:
    node: str
    rank: int
    pid: int
    why: str
    top: Frame | None

    def describe(self) -> str:
        top = f"; top of its stack: {self.top.describe()}" if self.top else ""
        return f"rank {self.rank} (pid {self.pid}) {self.why}{top}"


def pick_culprit(dumps: Iterable[RankDump], strong_only: bool = False) -> Culprit | None:
    """The live rank that is not waiting on its peers (stopped first, then uninterruptible, then stuck
    running, then stuck blocked; the lowest rank among equals). None when every live rank waits.
    ``strong_only``: only a stopped or uninterruptible rank -- the caller weighs a rank merely stuck outside a
    collective against a node that failed on its own (which a healthy rank busy computing must not outrank)."""
    ranked = sorted(((v[0], d.rank, d, v[1]) for d in dumps if (v := verdict(d)) and (not strong_only or v[0] <= STRONG)),
                    key=lambda x: x[:2])
    if not ranked:
        return None
    _, _, dump, why = ranked[0]
    frames = dump.last.frames
    return Culprit(dump.node, dump.rank, dump.pid, why, frames[0] if frames else None)


# Failures that are consequences of another node's failure, not root causes.
PEER_FAILURE = re.compile(
    r"Connection (reset|closed|refused)|connectFullMesh|Broken pipe|RendezvousClosedError|"
    r"DistNetworkError|Socket Timeout|timed out|SIGTERM|Signals\.SIGTERM",
    re.IGNORECASE,
)


def log_lines(failure, log_dir: Path | None = None) -> list[str]:
    """The node's whole log when we have it (the tail alone often shows only torchrun's summary): the failure's
    log file, else ``<log_dir>/<node>.log``, else its tail."""
    path = Path(failure.log_path) if failure.log_path else log_dir / f"{failure.node}.log" if log_dir else None
    if path is not None and path.exists():
        return path.read_text(errors="replace").splitlines()
    return failure.tail


def is_node_failure(failure) -> bool:
    """Did a node fail (a NodeError with the node's exit code, or its log: it exited, or lost its session), as
    opposed to the run stopping the job itself (the stall watchdog, the deadline: a NodeError on the head with
    neither)? Only a node's failure can be the node's own."""
    return failure.returncode is not None or bool(failure.log_path)


def own_failure(failures: list):
    """The first node (NodeError) that failed on its own: a node's failure (:func:`is_node_failure`) whose log does
    not read like a reaction to another's failure."""
    for failure in failures:
        if is_node_failure(failure) and not any(PEER_FAILURE.search(line) for line in log_lines(failure)):
            return failure
    return None


# A rank's exit code as its launcher reports it: torchrun's agent ("failed (exitcode: -9) local_rank: 0") and its
# error summary ("exitcode  : 137"), which the static starter writes too.
RANK_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")


def killed_by_a_signal(code: int) -> bool:
    """A rank ended by a signal (minus it where Python reports a child so ended, 128 + it where a shell does), but
    not by SIGTERM, the run's own stop."""
    return (code < 0 and code != -signal.SIGTERM) or (code > 128 and code != 128 + signal.SIGTERM)


def killed_rank(failures: list):
    """The first node (NodeError) whose launcher reported a rank of it killed by a signal
    (:func:`killed_by_a_signal`): a killed rank's node reads like a reaction too when the store it rendezvoused on
    went with the first node to end (torchrun's DistNetworkError). Under SLURM, ``--kill-on-bad-exit`` ended such
    a node's task before it said how it ended, once a peer whose collective failed at once had said so first."""
    for failure in failures:
        if is_node_failure(failure) and any(killed_by_a_signal(int(m[1])) for line in log_lines(failure)
                                            if (m := RANK_EXIT.search(line))):
            return failure
    return None


def pick_root_cause(failures: list, first):
    """The first failure whose log does not read like a reaction to another node's failure; when every one does,
    the first with a rank killed by a signal (:func:`killed_rank`); else ``first``."""
    return own_failure(failures) or killed_rank(failures) or first


def odd_collective(dumps: Iterable[RankDump]) -> Culprit | None:
    """The odd one out when the live ranks wait in different collectives (:mod:`multinode.diagnose.collectives`):
    the lowest rank of the smallest group; None when they do not differ, or no group is smaller than the others."""
    found = mismatch(dumps)
    if found is None or found.odd is None:
        return None
    dump = found.odd[0]
    frames = dump.last.frames
    return Culprit(dump.node, dump.rank, dump.pid, f"is the odd one out: {found.describe()}",
                   frames[0] if frames else None)


def root_cause(dumps: Iterable[RankDump], failures: Iterable = ()) -> Culprit | None:
    """The rank to name from the live ranks and the nodes' failures (NodeErrors, in the order they ended):
    a stopped or uninterruptible rank; else the odd one out when the ranks wait in different collectives (every
    rank waits, so the first to time out or the watchdog's stall says nothing of the cause); else none when a
    node failed on its own (the caller names it from its log: a rank busy computing when a peer crashed is not
    the cause); else a rank stuck outside any collective.

    ``failures`` are the nodes' failures; a stall or deadline has none (``root_cause(dumps)``), and the run's own
    stop, if it is passed among them, is not one (:func:`is_node_failure`): a rank asleep or blocked outside any
    collective while its peers wait is then named, not the head where the stop was recorded."""
    failures = list(failures)
    dumps = list(dumps)
    strong = pick_culprit(dumps, strong_only=True) or odd_collective(dumps)
    if strong is not None or own_failure(failures) is not None:
        return strong
    return pick_culprit(dumps)


__all__ = ["PEER_FAILURE", "RANK_EXIT", "Culprit", "is_node_failure", "killed_rank", "odd_collective", "own_failure",
           "pick_culprit", "pick_root_cause",
           "root_cause", "verdict", "waiting"]
