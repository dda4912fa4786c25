"""Taking stack dumps of a run's live ranks, on every node at once, over the runner with py-spy.

* :data:`CAPTURE` is one small Python program run by the node's own Python. It finds the run's ranks the
  way the gang-stop does (``MULTINODE_RUN_ID=<id>`` in ``/proc/*/environ``, restricted to the node's
  network namespace; the rank from ``RANK``, ``OMPI_COMM_WORLD_RANK`` or ``PMIX_RANK``), reads each one's
  state from ``/proc`` (R running, S sleeping, D uninterruptible, T stopped) and CPU time, and dumps its
  Python stack with ``py-spy dump --json`` (``--nonblocking`` for stopped and uninterruptible ones, which
  ptrace would wait for). ``samples=2`` takes a second look half a second later, so a rank that is merely
  passing through (printing its own timeout, exiting) is not mistaken for one that is stuck. Every py-spy
  call is time-bounded (:data:`PYSPY_TIMEOUT`).
* :func:`capture_command` is the shell line that runs it on one node; :func:`parse_capture` (pure) reads
  one node's output as a list of :class:`~multinode.diagnose.dumps.RankDump` (the model of a capture).
* :func:`capture` runs it over the runner on every node in parallel and returns a :class:`Capture`
  (the dumps per node, and why each node that could not be captured could not).

What the dumps mean is :mod:`multinode.diagnose.rank`'s (the root cause); how they are printed and saved,
:mod:`multinode.diagnose.report`'s.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from multinode.diagnose.dumps import Frame, RankDump, Sample


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
    if env.get(b"MULTINODE_GUARD") == b"1":  # training.guard in front of a rank (GRACE): not a rank itself
        continue
    try:  # a rank is a Python process: under srun the task's shell carries PMIX_RANK too
        if not os.path.basename(os.readlink("/proc/%s/exe" % d)).startswith("python"):
            continue
    except OSError:
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
             "os_thread_id": t.get("os_thread_id"),
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
            main = _main_thread(threads, raw["pid"])
            frames = tuple(Frame(f["name"], f["file"], f["line"], f.get("code", "")) for f in (main or {}).get("frames", []))
            samples.append(Sample(s["state"], s.get("cpu_ticks", 0), frames, len(threads), s.get("error")))
        dumps.append(RankDump(node, raw["pid"], raw["run_id"], raw["rank"], tuple(samples),
                              parent_is_rank=pids.get(raw.get("ppid")) == raw["rank"], raw=raw))
    return sorted(dumps, key=lambda d: (d.rank, d.parent_is_rank, d.pid))


def _main_thread(threads: list[dict], pid: int) -> dict | None:
    """The process's main thread among py-spy's: the one whose OS thread id is the pid (Linux), else the one named
    MainThread, else the first. By id first: a thread's name is read from the interpreter and may be missing, and
    py-spy lists the other threads before the main one (its order, py-spy 0.4.3)."""
    return next((t for t in threads if t.get("os_thread_id") == pid), None) \
        or next((t for t in threads if t["name"] == "MainThread"), threads[0] if threads else None)


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
        outputs[name] = runner.run_with_input(name, command, timeout=timeout, open_timeout=3).decode(errors="replace")

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


__all__ = ["CAPTURE", "PYSPY_TIMEOUT", "SECOND_LOOK", "Capture", "capture", "capture_command", "parse_capture"]
