"""Real local clusters for integration tests: the CLI in a subprocess, state in a temporary
MULTINODE_HOME, and a teardown that proves nothing of the cluster is left -- checked on the whole
host by tests/integration/leakcheck.py, not by the provider's own ``leftovers()``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import leakcheck

from bench.drills.common import RUN_BOUND

REPO = Path(__file__).resolve().parents[2]


def clean_env(home: Path, cluster: str, **extra: str) -> dict[str, str]:
    """The environment of a CLI call: no MULTINODE_* leaking in from `make` or the shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MULTINODE_")}
    env.update(MULTINODE_HOME=str(home), MULTINODE_CLUSTER=cluster, PYTHONUNBUFFERED="1", **extra)
    return env


@dataclass
class Cluster:
    name: str
    home: Path

    @property
    def state(self):
        from multinode.core.state import ClusterState

        return ClusterState.for_cluster(self.name, root=self.home)

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(self.home, self.name, **extra)

    def cli(self, *args: str, timeout: float = RUN_BOUND, **env: str) -> subprocess.CompletedProcess:
        """The CLI to its end; ``timeout`` a hang guard (by default past a run's own STALL_TIMEOUT: RUN_BOUND), whose
        expiry fails with the last lines the command printed."""
        try:
            return subprocess.run(
                [sys.executable, "-m", "multinode", *args],
                cwd=REPO, env=self.env(**env), capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired as expired:
            def tail(data) -> str:
                text = data.decode(errors="replace") if isinstance(data, bytes) else data or ""
                return "".join(text.splitlines(keepends=True)[-30:])
            raise TimeoutError(f"multinode {' '.join(args)[:200]}: no exit within {timeout:g} s; its stdout:\n"
                               f"{tail(expired.stdout)}\nits stderr:\n{tail(expired.stderr)}") from None

    def popen(self, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "multinode", *args],
            cwd=REPO, env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def inventory(self):
        return self.state.load_inventory()

    def job_processes(self) -> dict[str, list[int]]:
        """Processes other than sshd on every node, and any process of its runs outside the nodes:
        must be empty whenever no job runs (found by leakcheck.py, not by the provider)."""
        return leakcheck.job_processes(self.name, self.home)

    def runs(self) -> list[Path]:
        runs = self.state.runs_dir
        return sorted(runs.iterdir()) if runs.exists() else []


@dataclass
class ModuleView(Cluster):
    """One test module's view of a cluster that several modules share (conftest.py's ``shared_cluster3``): its
    :meth:`runs` are the runs made since the module began, as on a cluster of the module's own."""

    earlier: frozenset[str] = frozenset()

    def runs(self) -> list[Path]:
        return [run for run in super().runs() if run.name not in self.earlier]


@dataclass(frozen=True)
class Shape:
    """What a test that only trains on a cluster must leave as it found it: the inventory and the pinned host keys,
    the nodes' namespaces (by inode) and each node's sshd (by pid)."""

    inventory: bytes
    known_hosts: bytes
    namespaces: tuple[tuple[str, int], ...]
    sshd: tuple[tuple[str, tuple[int, ...]], ...]


def listening_sshd(cluster: Cluster, node: str) -> tuple[int, ...]:
    """The pids of the node's listening sshd: not the per-connection children, which come and go with sessions."""
    from multinode.providers.local.faults import node_pids

    pids = {pid for pid in node_pids(cluster.state, node) if _comm(pid) == "sshd"}
    return tuple(sorted(pid for pid in pids if _ppid(pid) not in pids))


def shape(cluster: Cluster) -> Shape:
    inv = cluster.inventory()
    sshd = [(node.name, listening_sshd(cluster, node.name)) for node in inv.nodes]
    return Shape(cluster.state.inventory_path.read_bytes(), Path(inv.known_hosts).read_bytes(),
                 tuple(sorted(leakcheck.namespace_inodes(cluster.name).items())), tuple(sshd))


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def assert_left_as_found(cluster: Cluster, before: Shape, timeout: float = 10.0) -> None:
    """After a test on a shared cluster: no process of its runs on any node or outside them (found by leakcheck.py;
    ``timeout`` for one that was just killed to be reaped), the claim given back, and the cluster's shape as
    before the test (no node replaced, restarted or re-keyed), so the next test finds the cluster it expects."""
    from multinode.backends.claim import lock_path

    deadline = time.monotonic() + timeout
    while any((left := cluster.job_processes()).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == {node.name: [] for node in cluster.inventory().nodes}, f"the test left processes: {left}"
    lock = Path(lock_path(cluster.inventory()))
    assert not lock.exists() or lock.read_text() == "", f"the test left the claim taken: {lock.read_text()!r}"
    after = shape(cluster)
    changed = [field for field in Shape.__dataclass_fields__ if getattr(after, field) != getattr(before, field)]
    assert not changed, (f"the test reshaped the shared cluster {cluster.name} ({', '.join(changed)}): "
                         "it needs a cluster of its own (conftest.py's cluster3)")


def new_cluster_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def bring_up(home: Path, nodes: int, prefix: str = "t", options: dict[str, str] | None = None) -> Cluster:
    """`multinode up` of a new cluster; ``options`` become ``-o KEY=VALUE`` (runtime, image, ...).
    Root only: without network namespaces there would be nothing for the leak checks to find."""
    leakcheck.require_root()
    cluster = Cluster(new_cluster_name(prefix), home)
    flags = [f"--option={key}={value}" for key, value in (options or {}).items()]
    res = cluster.cli("up", "--nodes", str(nodes), *flags, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return cluster


def tear_down(cluster: Cluster) -> None:
    """Nothing left running by the tests beyond the cluster's services (read before `down`, which would kill it
    unreported), `multinode down`, then nothing of the cluster anywhere on the host (see leakcheck.py). The cluster
    goes down whatever was left, then the leak fails the teardown."""
    nodes = len(cluster.inventory().nodes)
    now = leakcheck.namespace_inodes(cluster.name)
    assert len(now) == nodes, f"{cluster.name}: {len(now)} namespaces for {nodes} nodes"
    marks = leakcheck.marks(cluster.name, cluster.home)  # run ids, namespace inodes now and of replaced nodes
    left = leakcheck.running(cluster.name, cluster.home)
    res = cluster.cli("down", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    leakcheck.assert_nothing_left(marks)
    assert not left, f"cluster {cluster.name}: the tests left running (down killed them):\n" + "\n".join(left)


@contextlib.contextmanager
def sshd_options(cluster: Cluster, node: str, *lines: str):
    """``node``'s sshd runs with ``lines`` ahead of its own configuration (sshd keeps an option's first
    value), restarted, until the block ends."""
    from multinode.providers.local.meta import node_dir
    from multinode.providers.local.sshd import start_sshd, stop_sshd

    config = node_dir(cluster.state, node) / "sshd_config"
    original = config.read_text()
    config.write_text("".join(f"{line}\n" for line in lines) + original)
    stop_sshd(cluster.state, node)
    start_sshd(cluster.state, node)
    try:
        yield node_dir(cluster.state, node) / "sshd.log"
    finally:
        config.write_text(original)
        stop_sshd(cluster.state, node)
        start_sshd(cluster.state, node)


@contextlib.contextmanager
def another_torch(cluster: Cluster, node: str, root: Path):
    """``node``'s SSH sessions see another torch first on their path (its sshd sets PYTHONPATH to a second
    environment holding only a torch version file), until the block ends."""
    fake = root / "other-env" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this torch is only a version file')\n")
    (fake / "version.py").write_text("__version__ = '2.12.0+cpu'\ncuda = None\nhip = None\n")
    with sshd_options(cluster, node, f"SetEnv PYTHONPATH={fake.parent}"):
        yield cluster


def preempt_project(root: Path) -> Path:
    """A user project carrying our helpers (a copy of the ``training`` package, as a project without multinode
    installed carries it: ``training.preempt`` and what it gathers) and tests/integration/jobs/user_preempt.py, a
    plain loop with ``preempt.guard()``."""
    project = root / "project"
    (project / "training").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "integration" / "jobs" / "user_preempt.py", project)
    for path in (REPO / "training").glob("*.py"):
        shutil.copy(path, project / "training" / path.name)
    return project
