"""Which rank really failed: stacks and process states of every live rank, and the root-cause ranking.

A hung rank does not fail: its peers do, when their collective times out, and their logs all say
"timed out". Only the live processes can tell which one they were waiting for. This module:

* :func:`capture` runs one small Python program (:data:`CAPTURE`) over SSH on every node at once. It
  finds the run's ranks the way the gang-stop does (``MULTINODE_RUN_ID=<id>`` in ``/proc/*/environ``,
  restricted to the node's network namespace; the rank from ``RANK``, ``OMPI_COMM_WORLD_RANK`` or
  ``PMIX_RANK``), reads each one's state from ``/proc`` (R running, S sleeping, D uninterruptible,
  T stopped) and CPU time, and dumps its Python stack with ``py-spy dump --json`` (``--nonblocking``
  for stopped and uninterruptible ones, which ptrace would wait for). ``samples=2`` takes a second
  look half a second later, so a rank that is merely passing through (printing its own timeout, exiting)
  is not mistaken for one that is stuck. Every py-spy call is time-bounded.
* :func:`pick_culprit` (pure) names the rank that is not waiting on its peers: stopped, then
  uninterruptible, then stuck in the same place outside any collective or store wait in every sample
  (running: state R or busy; blocked: on the very same line in every look).
  A rank inside a collective is never the culprit: it is waiting for the culprit. When no live rank
  qualifies, the caller falls back to the logs (the rank that exited on its own first).
* :func:`group_stacks` (pure) prints identical stacks once with the ranks that share them
  (``multinode stacks``), and :func:`save` writes ``runs/<id>/stacks/node-i.{json,txt}``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PYSPY_TIMEOUT = 5.0  # seconds one py-spy dump may take before it is killed
SECOND_LOOK = 0.5  # seconds between the two samples taken at failure time

# Runs on the node with its own Python: argv = run id ("" = every run), samples, interval, py-spy timeout.
# Prints one JSON object: {"py_spy": path or null, "ranks": [{pid, run_id, rank, local_rank, ppid,
# samples: [null (gone) | {state, cpu_ticks, threads: [{name, active, frames: [{name, file, line, code}]}]
# | {state, cpu_ticks, error}]}]} -- state and CPU ticks of the main thread.
CAPTURE = r'''
import json, linecache, os, shutil, subprocess, sys, time
run_id, samples, interval, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
me = os.getpid()
def netns(p):
    try:
        return os.readlink("/proc/%s/ns/net" % p)
    except OSError:
        return None
own_ns = netns("self")
pyspy = os.path.join(os.path.dirname(sys.executable), "py-spy")
pyspy = pyspy if os.access(pyspy, os.X_OK) else shutil.which("py-spy")
def stat(p):
    try:  # the main thread's own state and CPU time (gloo's and torch's helper threads are not the program)
        raw = open("/proc/%d/task/%d/stat" % (p, p)).read()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2:].split()
    return f[0], int(f[1]), int(f[11]) + int(f[12])
ranks = {}
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == me:
        continue
    try:
        env = dict(e.split(b"=", 1) for e in open("/proc/%s/environ" % d, "rb").read().split(b"\0") if b"=" in e)
    except OSError:
        continue
    rid = env.get(b"MULTINODE_RUN_ID")
    rank = env.get(b"RANK", env.get(b"OMPI_COMM_WORLD_RANK", env.get(b"PMIX_RANK")))
    if rid is None or rank is None or (run_id and rid.decode() != run_id) or netns(d) != own_ns:
        continue
    st = stat(int(d))
    local = env.get(b"LOCAL_RANK", env.get(b"OMPI_COMM_WORLD_LOCAL_RANK", b""))
    ranks[int(d)] = {"pid": int(d), "run_id": rid.decode(), "rank": int(rank), "local_rank": local.decode(),
                     "ppid": st[1] if st else None, "samples": []}
def dump(pids):
    states, procs = {}, {}
    for p in pids:
        states[p] = stat(p)
        if states[p] and pyspy:
            argv = [pyspy, "dump", "--pid", str(p), "--json"]
            if states[p][0] in "TtD":
                argv.append("--nonblocking")  # ptrace would wait for a stopped or uninterruptible process
            procs[p] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + limit
    for p in pids:
        if states[p] is None:
            ranks[p]["samples"].append(None)
            continue
        entry = {"state": states[p][0], "cpu_ticks": states[p][2]}
        ranks[p]["samples"].append(entry)
        if p not in procs:
            entry["error"] = "py-spy is not installed next to %s or on PATH" % sys.executable
            continue
        try:
            out, err = procs[p].communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            procs[p].kill()
            procs[p].communicate()
            entry["error"] = "py-spy gave no answer within %.0f s" % limit
            continue
        if procs[p].returncode != 0:
            entry["error"] = (err.decode(errors="replace").strip().splitlines() or ["py-spy failed"])[-1][:300]
            if stat(p) is None:
                ranks[p]["samples"][-1] = None
            continue
        entry["threads"] = [
            {"name": t.get("thread_name") or str(t.get("thread_id")), "active": t.get("active"),
             "frames": [{"name": f["name"], "file": f["filename"], "line": f["line"],
                         "code": linecache.getline(f["filename"], f["line"]).strip()[:200]}
                        for f in t.get("frames", [])[:60]]}
            for t in json.loads(out or b"[]")]
for i in range(samples):
    if i:
        time.sleep(interval)
    dump(sorted(ranks))
print(json.dumps({"py_spy": pyspy, "ranks": list(ranks.values())}))
'''


def capture_command(python: str, run_id: str | None, samples: int = 1, interval: float = SECOND_LOOK,
                    limit: float = PYSPY_TIMEOUT) -> str:
    """The shell line that captures every live rank of ``run_id`` (None: of any run) on one node."""
    return shlex.join([python, "-c", CAPTURE, run_id or "", str(samples), str(interval), str(limit)])


# --- the model -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int
    code: str = ""

    def describe(self) -> str:
        where = f"{self.name} ({short_path(self.file)}:{self.line})"
        return f"{where}: {self.code}" if self.code else where


@dataclass(frozen=True)
class Sample:
    """One look at one rank. ``state`` None: the process was gone."""

    state: str | None
    cpu_ticks: int = 0  # the main thread's user + system time, in clock ticks
    frames: tuple[Frame, ...] = ()  # the main thread's stack, innermost first
    threads: int = 0
    error: str | None = None


@dataclass(frozen=True)
class RankDump:
    node: str
    pid: int
    run_id: str
    rank: int
    samples: tuple[Sample, ...]
    parent_is_rank: bool = False  # a child of a rank (DataLoader worker, ...) that inherited its RANK
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def last(self) -> Sample:
        alive = [s for s in self.samples if s.state is not None]
        return alive[-1] if alive else Sample(None)


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


def short_path(path: str) -> str:
    """torch/distributed/distributed_c10d.py rather than the whole site-packages path."""
    for marker in ("site-packages/", "dist-packages/", "/code/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def parse_capture(node: str, text: str) -> list[RankDump]:
    """The ranks in one node's :data:`CAPTURE` output (its last JSON line)."""
    line = next((ln for ln in reversed(text.strip().splitlines()) if ln.startswith("{")), "")
    data = json.loads(line) if line else {"ranks": []}
    pids = {r["pid"]: r["rank"] for r in data["ranks"]}
    dumps = []
    for raw in data["ranks"]:
        samples = []
        for s in raw["samples"]:
            if s is None:
                samples.append(Sample(None))
                continue
            threads = s.get("threads") or []
            main = next((t for t in threads if t["name"] == "MainThread"), threads[0] if threads else None)
            frames = tuple(Frame(f["name"], f["file"], f["line"], f.get("code", "")) for f in (main or {}).get("frames", []))
            samples.append(Sample(s["state"], s.get("cpu_ticks", 0), frames, len(threads), s.get("error")))
        dumps.append(RankDump(node, raw["pid"], raw["run_id"], raw["rank"], tuple(samples),
                              parent_is_rank=pids.get(raw.get("ppid")) == raw["rank"], raw=raw))
    return sorted(dumps, key=lambda d: (d.rank, d.parent_is_rank, d.pid))


# --- the ranking ------------------------------------------------------------------------------------

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
STATE_WORDS = {"R": "running", "S": "sleeping", "D": "uninterruptible", "T": "stopped", "t": "stopped (traced)",
               "Z": "zombie"}


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


def _log_lines(failure) -> list[str]:
    """The node's whole log when we have it (the tail alone often shows only torchrun's summary)."""
    if failure.log_path and Path(failure.log_path).exists():
        return Path(failure.log_path).read_text(errors="replace").splitlines()
    return failure.tail


def own_failure(failures: list):
    """The first node (NodeError) that failed on its own: its log does not read like a reaction to another's failure."""
    for failure in failures:
        if not any(PEER_FAILURE.search(line) for line in _log_lines(failure)):
            return failure
    return None


def pick_root_cause(failures: list, first):
    """The first failure whose log does not read like a reaction to another node's failure."""
    return own_failure(failures) or first


def root_cause(dumps: Iterable[RankDump], failures: list) -> Culprit | None:
    """The rank to name from the live ranks and the nodes' failures (NodeErrors, in the order they ended):
    a stopped or uninterruptible rank; else none when a node failed on its own (the caller names it from its
    log: a rank busy computing when a peer crashed is not the cause); else a rank stuck outside any collective."""
    dumps = list(dumps)
    strong = pick_culprit(dumps, strong_only=True)
    if strong is not None or own_failure(failures) is not None:
        return strong
    return pick_culprit(dumps)


# --- output -----------------------------------------------------------------------------------------


def stack_lines(sample: Sample) -> list[str]:
    if sample.error:
        return [f"(no stack: {sample.error})"]
    if not sample.frames:
        return ["(no Python frames)"]
    return [f.describe() for f in sample.frames]


def group_stacks(dumps: Iterable[RankDump]) -> str:
    """Identical main-thread stacks printed once, with the ranks (and nodes) that share them."""
    groups: dict[tuple[str, ...], list[RankDump]] = {}
    for dump in dumps:
        if dump.last.state is None:
            continue
        groups.setdefault(tuple(stack_lines(dump.last)), []).append(dump)
    lines = []
    for stack, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0].rank)):
        who = ", ".join(f"{d.rank} on {d.node}{' (child)' if d.parent_is_rank else ''}" for d in members)
        states = ", ".join(sorted({STATE_WORDS.get(d.last.state, d.last.state) for d in members}))
        lines.append(f"{len(members)} rank{'s' if len(members) > 1 else ''} ({who}), {states}:")
        lines.extend(f"    {line}" for line in stack)
    return "\n".join(lines) if lines else "no live rank found"


def describe_node(dumps: list[RankDump]) -> str:
    """A readable dump of one node: every rank, every sample, every thread's stack."""
    lines = []
    for dump in dumps:
        lines.append(f"rank {dump.rank} pid {dump.pid}{' (child of a rank)' if dump.parent_is_rank else ''}:")
        for i, raw in enumerate(dump.raw.get("samples", [])):
            if raw is None:
                lines.append(f"  sample {i + 1}: gone")
                continue
            lines.append(f"  sample {i + 1}: state {raw['state']} ({STATE_WORDS.get(raw['state'], '?')}), "
                         f"cpu {raw.get('cpu_ticks', 0)} ticks{': ' + raw['error'] if raw.get('error') else ''}")
            for thread in raw.get("threads", []):
                lines.append(f"    thread {thread['name']}{' (active)' if thread.get('active') else ''}:")
                lines.extend(f"      {Frame(f['name'], f['file'], f['line'], f.get('code', '')).describe()}"
                             for f in thread["frames"])
    return "\n".join(lines) if lines else "no live rank of the run on this node"


def save(directory: Path, per_node: dict[str, list[RankDump]], errors: dict[str, str]) -> Path:
    """Write ``node-i.json`` (raw) and ``node-i.txt`` (readable) per node, and ``stacks.txt`` (grouped)."""
    directory.mkdir(parents=True, exist_ok=True)
    for node, dumps in per_node.items():
        (directory / f"{node}.json").write_text(json.dumps([d.raw for d in dumps], indent=1))
        (directory / f"{node}.txt").write_text(describe_node(dumps) + "\n")
    for node, why in errors.items():
        (directory / f"{node}.txt").write_text(f"no capture: {why}\n")
    every = [d for dumps in per_node.values() for d in dumps]
    (directory / "stacks.txt").write_text(group_stacks(every) + "\n")
    return directory


# --- the executor -----------------------------------------------------------------------------------


@dataclass
class Capture:
    per_node: dict[str, list[RankDump]]
    errors: dict[str, str]  # node -> why it could not be captured
    seconds: float = 0.0

    @property
    def dumps(self) -> list[RankDump]:
        return [d for dumps in self.per_node.values() for d in dumps]


def capture(runner, run_id: str | None, samples: int = 1, names: Iterable[str] | None = None) -> Capture:
    """Capture every live rank of ``run_id`` on every node at once (bounded: py-spy timeout per sample)."""
    import time

    start = time.monotonic()
    inv = runner.inventory
    names = list(names or (n.name for n in inv.nodes))
    command = capture_command(inv.python, run_id, samples)
    timeout = samples * (PYSPY_TIMEOUT + SECOND_LOOK) + 5
    outputs: dict[str, str] = {}

    def one(name: str) -> None:
        # A short channel-open timeout, as for the stop: a node that cannot open a channel in 3 s is gone
        # (crashed, cut off), and the capture must not hold the gang-stop back for it.
        outputs[name] = runner._exec_raw(name, command, timeout=timeout, open_timeout=3).decode(errors="replace")

    failed = runner.parallel(one, names, timeout=timeout + 2)
    per_node, errors = {}, {}
    for name in names:
        try:
            if failed.get(name) is not None:
                raise ValueError(str(failed[name]).strip().splitlines()[0] if str(failed[name]).strip()
                                 else type(failed[name]).__name__)
            per_node[name] = parse_capture(name, outputs[name])
        except (ValueError, KeyError, IndexError) as err:
            errors[name] = str(err)
    return Capture(per_node, errors, round(time.monotonic() - start, 2))


__all__ = ["CAPTURE", "PEER_FAILURE", "Capture", "Culprit", "Frame", "RankDump", "Sample", "capture", "capture_command",
           "group_stacks", "own_failure", "parse_capture", "pick_culprit", "pick_root_cause", "root_cause", "save",
           "waiting"]
