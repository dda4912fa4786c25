"""The baselines' side of every benchmark: running things on a local cluster's nodes by hand.

A benchmark compares the orchestrator (``python -m multinode train ...``) with what a person would
type on the same nodes. "By hand" here means plain OpenSSH with the cluster's key and pinned
host keys, one session per node (:meth:`LocalCluster.run_by_hand`), running a shell line per node: the
seed's torchrun line, built from the inventory (``bench.throughput``, ``bench.launch``), or, where the
baseline is the orchestrator's own line typed by hand (the MPI collectives' *raw*), the line its ``--dry-run``
prints (:meth:`LocalCluster.shells`).
``ip netns exec`` reaches a node directly where no SSH is wanted (iperf3).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "bench" / "jobs"
HOME_PREFIX = "mn-bench-"
SHELL_LINE = re.compile(r"^\[(node-\d+)\] shell: (.*)$")


def parse_dry_run(text: str) -> dict[str, str]:
    """{node: shell line} from ``multinode train --dry-run`` output."""
    return {m[1]: m[2] for m in map(SHELL_LINE.match, text.splitlines()) if m}


def median(values) -> float:
    return statistics.median(values)


@dataclass
class LocalCluster:
    """A local cluster the benchmark brought up in its own MULTINODE_HOME (the CLI in subprocesses)."""

    name: str
    home: Path
    nodes: int
    mtu: int | None = None
    _inventory: object = field(default=None, repr=False)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MULTINODE_")}
        env.update(MULTINODE_HOME=str(self.home), MULTINODE_CLUSTER=self.name, PYTHONUNBUFFERED="1", **extra)
        return env

    def cli(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "multinode", *args], cwd=REPO, env=self.env(),
                             capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"multinode {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    @property
    def inventory(self):
        if self._inventory is None:
            from multinode.core.state import ClusterState

            self._inventory = ClusterState.for_cluster(self.name, root=self.home).load_inventory()
        return self._inventory

    def ip(self, i: int) -> str:
        return self.inventory.nodes[i].private_ip

    def netns(self, i: int) -> str:
        return self.inventory.extra["namespaces"][i]

    def workdir(self, i: int) -> Path:
        return Path(self.inventory.workdir_for(f"node-{i}"))

    def ssh(self, i: int, command: str) -> list[str]:
        """argv of an OpenSSH session running ``command`` on node i (cluster key, pinned host keys)."""
        from multinode.app.verbs import ssh_argv

        base = ssh_argv(self.inventory, str(i))
        return [*base[:-1], "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", base[-1], command]

    def shells(self, *train_args: str) -> tuple[str, dict[str, str]]:
        """(run id, {node: shell line}) of a planned job, exactly as the orchestrator would run it."""
        run_id = f"hand-{uuid.uuid4().hex[:8]}"
        res = self.cli("train", *train_args, "--run-id", run_id, "--dry-run")
        return run_id, parse_dry_run(res.stdout)

    def run_by_hand(self, shells: dict[str, str], run_id: str, timeout: float = 600) -> "HandRun":
        """One OpenSSH session per node, all started at once, like N terminals; waits for all.

        ``MULTINODE_RUN_ID`` is exported only so a failed run can be swept by its tag afterwards.
        """
        start = time.monotonic()
        procs = {}
        for node, line in shells.items():
            i = int(node.split("-")[1])
            command = f"export MULTINODE_RUN_ID={shlex.quote(run_id)} && {line}"
            procs[node] = subprocess.Popen(self.ssh(i, command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
        outputs, codes = {}, {}
        for node, proc in procs.items():
            try:
                outputs[node], _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs[node], _ = proc.communicate()
            codes[node] = proc.returncode
        run = HandRun(run_id, codes, outputs, time.monotonic() - start)
        if not run.ok:
            self.sweep(run_id)
        return run

    def sweep(self, run_id: str) -> None:
        """Stop whatever a failed hand-run left behind (processes tagged with its run id)."""
        from multinode.ssh.runner import RemoteRunner

        with RemoteRunner(self.inventory, out=io.StringIO()) as runner:
            runner.stop_all(run_id)

    def down(self) -> None:
        """Tear the cluster down (the CLI verifies nothing is left) and remove its MULTINODE_HOME."""
        self.cli("down", timeout=180)
        if self.home.name.startswith(HOME_PREFIX):
            shutil.rmtree(self.home, ignore_errors=True)


@dataclass
class HandRun:
    run_id: str
    exit_codes: dict[str, int]
    outputs: dict[str, str]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exit_codes.values())

    def text(self) -> str:
        return "\n".join(self.outputs.values())

    def failure(self) -> str:
        return "\n".join(f"--- {node} (exit {code})\n{self.outputs[node][-2000:]}"
                         for node, code in self.exit_codes.items() if code != 0)


def bring_up(nodes: int, prefix: str, mtu: int | None = None, home: Path | None = None) -> LocalCluster:
    """A fresh local cluster under its own unique name (in ``home``, default a new temp dir)."""
    home = home or Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
    cluster = LocalCluster(f"{prefix}-{uuid.uuid4().hex[:6]}", home, nodes, mtu)
    args = ["up", "--nodes", str(nodes)] + (["--mtu", str(mtu)] if mtu else [])
    cluster.cli(*args, timeout=180)
    return cluster
