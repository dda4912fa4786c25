"""The control-plane section's measurements on one cluster of N nodes (:mod:`bench.control_plane` runs them
per N, judges and reports them):

* :class:`ControlPlane`: one run of the trivial job, *ours* (``multinode train``) or *pdsh*, timed to its exit
  with the orchestrator's peak memory (:func:`timed`, in a small parent process) and its phases;
* :func:`session_rounds`: a round of ``true`` on every node, a new SSH session each vs the persistent shells;
* :func:`connection_rounds`: one connection to an open session, paramiko's own socket vs ours.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.nodes import JOBS, REPO, LocalCluster, median

JOB = JOBS / "trivial.py"
TRIVIAL = re.compile(r"TRIVIAL (\d+) (\d+)")
LOGS = re.compile(r"^\s*logs: (\S+)\s*$", re.MULTILINE)
CONNECT_WAIT = 60.0  # seconds a session round waits for every node to answer SSH (retried, as pre-flight does)


def ranks_printed(text: str, world_size: int) -> set[int]:
    """The ranks whose ``TRIVIAL <rank> <world size>`` line is in ``text`` with the right world size."""
    return {int(m[1]) for m in TRIVIAL.finditer(text) if int(m[2]) == world_size}  # lines may be prefixed



# Runs argv[2:] as its child and writes "<seconds> <peak KiB>" to argv[1]. A process's ru_maxrss carries over
# exec the peak of the memory it was forked from: reaped by this benchmark's own (large) Python it would report
# that; forked from this small one it reports the command's own peak. The seconds run from the fork to the reap.
MEASURE = r"""
import os, signal, sys, time
start = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{time.monotonic() - start} {usage.ru_maxrss}\n")
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def timed(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run ``argv`` to its exit: {seconds, code, output, peak_kib}, measured by a small Python parent (MEASURE);
    its output goes to a file (no pipe to drain while it runs); killed at ``timeout``."""
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.NamedTemporaryFile(mode="r") as measured:
        proc = subprocess.Popen([sys.executable, "-S", "-c", MEASURE, measured.name, *argv], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the parent kills the command, then reports
            code = proc.wait()
        seconds, peak = (measured.read().split() or ["nan", "0"])
        out.seek(0)
        output = out.read()
    return {"seconds": float(seconds), "code": code, "output": output, "peak_kib": int(peak)}


class ControlPlane:
    """The two ways to run the trivial job on one cluster (all of its nodes)."""

    def __init__(self, cluster: LocalCluster):
        from bench.launch import Launch

        self.cluster = cluster
        self.n = cluster.nodes
        self.launch = Launch(cluster)  # its ssh options, user, node python and code layout

    def ours(self) -> list[str]:
        return [sys.executable, "-m", "multinode", "train", "--nodes", str(self.n), "--script", str(JOB)]

    def pdsh(self) -> list[str]:
        # The node's own project dir, found from its hostname (<cluster>-node-<i>) as bench/launch.py does;
        # %n: pdsh's rank of the host in the -w list. -S: pdsh exits with the largest remote exit code.
        project = str(self.launch.code).replace("{node}", "node-$(( $(hostname | sed 's/.*-//') ))") + "/project"
        line = f"cd {project} && RANK=%n WORLD_SIZE={self.n} {shlex.quote(self.launch.python)} {JOB.name}"
        hosts = ",".join(self.cluster.ip(i) for i in range(self.n))
        return ["pdsh", "-S", "-R", "ssh", "-f", "64", "-l", self.launch.user, "-w", hosts, line]

    def env(self, method: str) -> dict[str, str]:
        env = self.cluster.env()
        if method == "pdsh":
            env["PDSH_SSH_ARGS_APPEND"] = self.launch.ssh_opts
        return env

    def measure(self, method: str, timeout: float = 600) -> dict:
        """One run: {exited_s}, plus {peak_mib, phases} for ours. Raises unless exit 0 and all N ranks printed."""
        argv = self.ours() if method == "ours" else self.pdsh()
        res = timed(argv, self.env(method), timeout)
        printed = ranks_printed(res["output"], self.n)
        if res["code"] != 0 or printed != set(range(self.n)):
            raise RuntimeError(f"{method} at N={self.n}: exit {res['code']}, {len(printed)}/{self.n} ranks printed:\n"
                               f"{res['output'][-3000:]}")
        sample = {"exited_s": res["seconds"]}
        if method == "ours":
            sample["peak_mib"] = res["peak_kib"] / 1024
            sample["phases"] = self.phases(res["output"])
        return sample

    def phases(self, output: str) -> dict[str, float]:
        """{phase: seconds} from the run's summary.json ({} where the orchestrator writes none)."""
        logs = LOGS.findall(output)
        if not logs:
            raise RuntimeError(f"ours at N={self.n}: no 'logs: <dir>' line in its output:\n{output[-3000:]}")
        summary = json.loads((Path(logs[-1]) / "summary.json").read_text())
        return dict(summary.get("phases") or {})


def session_rounds(cluster: LocalCluster, repeats: int) -> dict[str, float]:
    """Why one shell per node: the median wall seconds of one round of ``true`` on every node, (a) each in a new
    SSH session of an open connection -- what running every command as an exec (Fabric's ``run``) costs the
    nodes: sshd starts the login shell and its rc files each time -- and (b) in the nodes' persistent shells
    (:mod:`multinode.ssh.shell`), over the same connections; and (c) one new session on node-0 alone (what N of
    them at once would take if they only shared this host's cores: N x that / cores)."""
    import io

    from multinode.ssh.runner import RemoteRunner

    def in_new_session(runner: RemoteRunner, name: str) -> None:
        channel = runner.connection(name).transport.open_session(timeout=30)
        try:
            channel.exec_command("true")
            if channel.recv_exit_status() != 0:
                raise RuntimeError(f"{name}: true failed in a new session")
        finally:
            channel.close()

    names = [f"node-{i}" for i in range(cluster.nodes)]
    times: dict[str, list[float]] = {"alone": [], "session": [], "shell": []}
    with RemoteRunner(cluster.inventory, out=io.StringIO()) as runner:
        # Retried as pre-flight retries, and what failed said node by node (a cold run of the suite, 2026-11-29: a
        # node of a cluster just brought up on a loaded host failed the one 10 s attempt; why, the old line dropped).
        if failed := runner.connect_until(names, time.monotonic() + CONNECT_WAIT):
            raise RuntimeError(f"session rounds at N={cluster.nodes}: no answer within {CONNECT_WAIT:g} s from "
                               + "; ".join(f"{name}: {why}" for name, why in failed.items()))
        runner.run_all("true", timeout=60)  # every node's first shell has run its login shell
        for _ in range(repeats):
            start = time.monotonic()
            in_new_session(runner, names[0])
            times["alone"].append(time.monotonic() - start)
            start = time.monotonic()
            failed = {k: v for k, v in runner.parallel(lambda name: in_new_session(runner, name), names, 120).items() if v}
            times["session"].append(time.monotonic() - start)
            start = time.monotonic()
            answers = runner.run_all("true", timeout=60)
            times["shell"].append(time.monotonic() - start)
            failed.update({k: v.error for k, v in answers.items() if not v.ok})
            if failed:
                raise RuntimeError(f"session rounds at N={cluster.nodes}: {failed}")
    return {"session_alone_s": median(times["alone"]), "session_round_s": median(times["session"]),
            "shell_round_s": median(times["shell"])}


def connection_rounds(cluster: LocalCluster, repeats: int) -> dict[str, float]:
    """What :class:`multinode.ssh.connect.QuickAckSocket` saves: the median milliseconds from nothing to an open
    session on node-0 (TCP connect, key exchange, authentication, the session's channel), ``repeats`` times each,
    alternating, (a) with paramiko's own socket -- how every connection was made before -- and (b) as
    :func:`multinode.ssh.connect.open_connection` makes it. Same key, same pinned host key, one at a time."""
    import paramiko

    from multinode.ssh.connect import fabric_config, open_connection, pinned_client

    inv = cluster.inventory
    node = inv.nodes[0]
    pinned = paramiko.HostKeys(inv.known_hosts)

    def plain() -> None:
        client = pinned_client(node, pinned)
        client.connect(node.ssh_host, node.ssh_port, node.ssh_user, key_filename=[inv.ssh_key], look_for_keys=False,
                       allow_agent=False, timeout=30)
        try:
            client.get_transport().open_session(timeout=30).close()
        finally:
            client.close()

    def ours() -> None:
        conn = open_connection(node, inv.ssh_key, pinned, fabric_config(), 30)
        try:
            conn.transport.open_session(timeout=30).close()
        finally:
            conn.close()

    times: dict[str, list[float]] = {"plain": [], "ours": []}
    for _ in range(repeats):
        for label, connect in (("plain", plain), ("ours", ours)):
            start = time.monotonic()
            connect()
            times[label].append((time.monotonic() - start) * 1000)
    return {"connect_plain_ms": median(times["plain"]), "connect_ours_ms": median(times["ours"])}
