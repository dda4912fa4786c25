"""What is left of a local cluster on the whole host, found without the code under test.

`down` judges itself with ``multinode.providers.local.provider.leftovers``; the tests must not take its word.
This module derives every name from the cluster's name and MULTINODE_HOME on its own (the naming
scheme documented in scripts/multinode/providers/local/netns.py, re-implemented here) and looks at the
host as a whole, through /proc, /run/netns, /etc/netns and ``ip link``:

* every process whose environment carries one of the cluster's run ids (``MULTINODE_RUN_ID=<id>``),
  its ``MULTINODE_CLUSTER=<name>`` or its ``MULTINODE_HOME`` (the orchestrator and anything it started);
* every process whose command line or working directory lies under the cluster's state directory
  (every sshd of the cluster runs ``sshd -f <home>/<cluster>/.../sshd_config``);
* every process inside one of the cluster's network namespaces -- recorded by inode while they existed,
  so a process that keeps a deleted namespace alive is still found: :func:`marks` joins the inodes that the
  session's :class:`NamespaceWatch` (conftest.py starts it) saw, so a node replaced during a test (a new namespace
  under the same name) leaves its old namespace's number in the marks too;
* every namespace ``mn-<cluster>-<i>``, ``/etc/netns`` entry of it, and link ``mnb<hash>``,
  ``mnh<hash><i>`` or ``mnp<hash><i>``.

Before `down`, :func:`running` finds what a test left running on the cluster beyond its services (sshd, the SLURM
daemons): `down` would kill it without a word, so the teardown reads it first and fails on it
(``localcluster.tear_down``).

Namespaces need root: :func:`require_root` makes a cluster test fail (not pass) without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")


class RootRequired(RuntimeError):
    pass


def require_root() -> None:
    """Local clusters get network namespaces only as root; without them the leak checks would find
    nothing because nothing was there to find. Fail loudly instead of passing."""
    if os.geteuid() != 0:
        raise RootRequired("the integration tests with local clusters need root (network namespaces, "
                           "sshd per node); run them as root, e.g. sudo .venv/bin/python -m pytest tests/integration")


def tag(cluster: str) -> str:
    """The 6 hex digits in the cluster's link names: sha256 of its name."""
    return hashlib.sha256(cluster.encode()).hexdigest()[:6]


@dataclass(frozen=True)
class Marks:
    """Everything that identifies one cluster on the host."""

    cluster: str
    home: Path
    run_ids: frozenset[str]
    net_inodes: frozenset[int]  # its namespaces' inodes, read while they existed

    @property
    def state_dir(self) -> Path:
        return self.home / self.cluster


def namespaces(cluster: str) -> list[str]:
    pattern = re.compile(rf"mn-{re.escape(cluster)}-\d+")
    names = os.listdir(NETNS_RUN) if NETNS_RUN.is_dir() else []
    return sorted(n for n in names if pattern.fullmatch(n))


def run_ids(cluster: str, home: Path) -> set[str]:
    """Every run of the cluster: ``runs/<id>`` in its state directory and in each node's directory."""
    state = Path(home) / cluster
    dirs = [*state.glob("runs/*"), *state.glob("provider/nodes/*/runs/*")]
    return {p.name for p in dirs if p.is_dir()}


def namespace_inodes(cluster: str) -> dict[str, int]:
    """{namespace: inode} of the cluster's namespaces that exist now."""
    inodes = {}
    for ns in namespaces(cluster):
        try:
            inodes[ns] = os.stat(NETNS_RUN / ns).st_ino
        except OSError:
            continue
    return inodes


def marks(cluster: str, home: Path) -> Marks:
    """Read while the cluster is up: its run ids, its namespaces' inodes now and every one the session's watch saw
    (those of nodes replaced since)."""
    seen = SESSION_WATCH.seen.get(cluster, set()) if SESSION_WATCH else set()
    now = set(namespace_inodes(cluster).values())
    return Marks(cluster, Path(home), frozenset(run_ids(cluster, home)), frozenset(now | seen))


def other_clusters(cluster: str) -> set[int]:
    """The inodes of every named namespace that exists now and is not one of the cluster's own nodes: another
    cluster's node (a process there is that cluster's, whatever run id it carries: tests side by side use the same
    fixed run ids) or anything else named in /run/netns (a container's). A namespace number is unique only while
    the namespace exists: a number the cluster's replaced node had (see :class:`NamespaceWatch`) may belong to
    one of these now."""
    pattern = re.compile(rf"mn-{re.escape(cluster)}-\d+")
    names = os.listdir(NETNS_RUN) if NETNS_RUN.is_dir() else []
    inodes = set()
    for name in names:
        if not pattern.fullmatch(name):
            try:
                inodes.add(os.stat(NETNS_RUN / name).st_ino)
            except OSError:
                continue
    return inodes


def _net_inode(pid: str) -> int | None:
    try:
        return int(os.readlink(f"/proc/{pid}/ns/net").split("[")[1].rstrip("]"))
    except (OSError, IndexError, ValueError):
        return None


def job_processes(cluster: str, home: Path) -> dict[str, list[int]]:
    """Processes of the cluster other than sshd, found on the whole host: per node, those in its
    namespace (``node-<i>`` for ``mn-<cluster>-<i>``); under ``"outside the nodes"`` (only when there are
    any), those elsewhere whose environment carries one of its run ids. Empty lists whenever no job runs."""
    nodes = {ino: f"node-{ns.rsplit('-', 1)[1]}" for ns, ino in namespace_inodes(cluster).items()}
    found: dict[str, list[int]] = {name: [] for name in sorted(nodes.values(), key=lambda n: int(n[5:]))}
    tags = {f"MULTINODE_RUN_ID={r}".encode() for r in run_ids(cluster, home)}
    others = other_clusters(cluster)
    outside = []
    for entry in Path("/proc").iterdir():
        pid = entry.name
        if not pid.isdigit() or pid == str(os.getpid()):
            continue
        net = _net_inode(pid)
        node = nodes.get(net)
        if node is not None:
            if _read(entry / "comm").strip() != b"sshd":
                found[node].append(int(pid))
        elif net not in others and tags & set(_read(entry / "environ").split(b"\0")):
            outside.append(int(pid))
    if outside:
        found["outside the nodes"] = sorted(outside)
    return {name: sorted(pids) for name, pids in found.items()}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _describe(pid: str) -> str:
    cmd = _read(Path(f"/proc/{pid}/cmdline")).replace(b"\0", b" ").decode(errors="replace").strip()
    return f"process {pid} ({cmd[:160] or '?'})"


def wait_inside(pid: int, inode: int, command: str, timeout: float = 30.0) -> None:
    """Wait, at most ``timeout`` s, until process ``pid`` runs ``command`` inside the network namespace ``inode``.
    ``Popen(["ip", "netns", "exec", ...])`` (or ``nsenter``) returns before its child has entered the namespace and
    exec'd the command: a leak check that reads /proc before then finds the child in the host's namespace, running
    ``ip``, and nothing of the cluster (a cold run of b391648 under load: the teardown passed, "DID NOT RAISE")."""
    deadline = time.monotonic() + timeout
    while not (_net_inode(str(pid)) == inode and _read(Path(f"/proc/{pid}/cmdline")).startswith(command.encode())):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not run {command!r} in namespace {inode} within {timeout} s")
        time.sleep(0.05)


def processes(m: Marks) -> list[str]:
    """Every process on the host that belongs to the cluster, with the reason it was matched."""
    env_marks = {f"MULTINODE_RUN_ID={r}".encode() for r in m.run_ids}
    env_marks |= {f"MULTINODE_CLUSTER={m.cluster}".encode(), f"MULTINODE_HOME={m.home}".encode()}
    state = str(m.state_dir).encode()
    nets = {f"net:[{ino}]" for ino in m.net_inodes}
    others = other_clusters(m.cluster)
    mine = {str(os.getpid())}
    found = []
    for entry in Path("/proc").iterdir():
        pid = entry.name
        if not pid.isdigit() or pid in mine:
            continue
        reasons = []
        env = set(_read(entry / "environ").split(b"\0"))
        net = _net_inode(pid)
        if net in others:  # another cluster's node: its run ids may be spelled like ours
            env -= {e for e in env if e.startswith(b"MULTINODE_RUN_ID=")}
        reasons += [f"env {e.decode()}" for e in sorted(env & env_marks)]
        if state in _read(entry / "cmdline"):
            reasons.append("command line under the state directory")
        try:
            if os.readlink(entry / "cwd").encode().startswith(state):
                reasons.append("working directory under the state directory")
        except OSError:
            pass
        # A namespace's inode is unique only while it exists: one of ours that is gone may have handed its number to
        # another cluster's namespace (tests side by side). A process of ours that keeps a deleted namespace alive
        # keeps its number too, so a number another live cluster holds now is not ours.
        if f"net:[{net}]" in nets and net not in others:
            reasons.append("in one of the cluster's network namespaces")
        if reasons and (entry / "stat").exists():
            found.append(f"{_describe(pid)}: {', '.join(reasons)}")
    return found


def links(cluster: str) -> list[str]:
    t = tag(cluster)
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n == f"mnb{t}" or re.fullmatch(rf"mn[hp]{t}\d+", n)]


def leaks(m: Marks) -> list[str]:
    """Everything of the cluster that still exists on the host ([] when it is all gone)."""
    left = [f"namespace {ns}" for ns in namespaces(m.cluster)]
    left += [f"/etc/netns entry {p}" for p in NETNS_ETC.glob(f"mn-{m.cluster}-*")]
    left += [f"link {name}" for name in links(m.cluster)]
    left += processes(m)
    return left


# What `up` starts on a node and `down` stops: the node's sshd, and with SCHEDULER=slurm the daemons of
# multinode.providers.local.slurm (slurmd forks slurmscriptd); a node's metadata endpoint too (a python process, known
# by the pid file multinode.providers.local.imds keeps: see _endpoints). Anything else running on a node when a test is
# done with its cluster is the test's: a leak, whatever `down` would do to it.
SERVICES = {b"sshd", b"munged", b"slurmctld", b"slurmd", b"slurmscriptd"}


def _endpoints(cluster: str, home: Path) -> set[int]:
    """The pids of the metadata endpoints the cluster's nodes serve (multinode.providers.local.imds), by their pid
    files; a node replaced by recovery serves one again, as `up` made it."""
    pids = set()
    for pid_file in (Path(home) / cluster).glob("provider/node-*/imds/server.pid"):
        pid = _read(pid_file).strip()
        if pid.isdigit():
            pids.add(int(pid))
    return pids


def running(cluster: str, home: Path, timeout: float = 10.0) -> list[str]:
    """The processes of the cluster that are not its services, on its nodes or anywhere carrying one of its run ids,
    described; ``timeout`` for one just killed to be reaped. Read before `down`, which kills them."""
    deadline = time.monotonic() + timeout
    while True:
        endpoints = _endpoints(cluster, home)
        found = [pid for pids in job_processes(cluster, home).values() for pid in pids
                 if _read(Path(f"/proc/{pid}/comm")).strip() not in SERVICES and pid not in endpoints]
        if not found or time.monotonic() >= deadline:
            return [_describe(str(pid)) for pid in found if Path(f"/proc/{pid}").exists()]
        time.sleep(0.2)


def assert_nothing_left(m: Marks, timeout: float = 10.0) -> None:
    """Nothing of the cluster within ``timeout`` (a process that was just killed may need a moment to be reaped)."""
    deadline = time.monotonic() + timeout
    while (left := leaks(m)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"cluster {m.cluster} left behind:\n" + "\n".join(left)


class NamespaceWatch:
    """For a cluster made by a subprocess the test cannot pause (the benchmarks): while it runs, records the
    inode of every ``mn-<cluster>-<i>`` namespace that appears, so :func:`marks_seen` can build each
    cluster's marks afterwards as :func:`marks` does while a cluster is up."""

    def __init__(self, interval: float = 0.05) -> None:
        # 50 ms: a replaced node's namespace lives for seconds (its sshd is started and probed before the run goes on).
        self.seen: dict[str, set[int]] = {}
        self._before = set(os.listdir(NETNS_RUN)) if NETNS_RUN.is_dir() else set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True)

    def __enter__(self) -> NamespaceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for name in (os.listdir(NETNS_RUN) if NETNS_RUN.is_dir() else []):
                match = re.fullmatch(r"mn-(.+)-\d+", name)
                if match and name not in self._before:
                    try:
                        self.seen.setdefault(match[1], set()).add(os.stat(NETNS_RUN / name).st_ino)
                    except OSError:
                        continue

    def marks_seen(self, cluster: str, home: Path) -> Marks:
        """The marks of a cluster that has come and gone (its run ids are gone with its state directory:
        processes are found by its name, home and namespaces)."""
        return Marks(cluster, Path(home), frozenset(), frozenset(self.seen.get(cluster, ())))


SESSION_WATCH: NamespaceWatch | None = None  # set by conftest.py for the whole session of a test process


@contextlib.contextmanager
def session_watch():
    """Every namespace of every cluster made while the block runs, recorded for :func:`marks`."""
    global SESSION_WATCH
    with NamespaceWatch() as watch:
        SESSION_WATCH = watch
        try:
            yield watch
        finally:
            SESSION_WATCH = None
