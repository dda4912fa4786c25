"""Control plane at scale (issue 13): a trivial job on N = 8, 16, 32, 64 nodes, ours vs pdsh.

    python -m bench.control_plane [--quick] [--out-dir docs]     (its own cluster per N; quick: N = 2, 4)

The job (``bench/jobs/trivial.py``) prints ``TRIVIAL <rank> <world size>`` and exits; no torch, so
a run's time is the control plane's own. Per N, on a fresh cluster of exactly N nodes:

* **up** / **down**: wall seconds of ``python -m multinode up --nodes N`` and of ``down``;
* **ours**: ``python -m multinode train --nodes N --script bench/jobs/trivial.py`` (default launcher):
  start-up, pre-flight, code sync, launch, line prefixes, the sweep and the summary;
* **pdsh**: ``pdsh -S -R ssh -f 64`` of ``cd <the node's synced project dir> && RANK=%n WORLD_SIZE=N
  <node python> trivial.py`` on every node, with the cluster's key and pinned host keys (the ssh options
  of bench/launch.py). It runs the code the orchestrator synced: a first, untimed *ours* run does the sync.

*ours* and *pdsh* are interleaved (order rotated each round); each cell is the median of the rounds'
"command to exit" seconds. Every run must exit 0 with all N ranks printed, else the section fails
with the output's tail. The orchestrator's peak memory is the ``ru_maxrss`` that ``os.wait4`` returns
for the CLI process, reaped by a small Python parent (MEASURE: reaped by this benchmark's own Python it would
carry that process's peak over the exec; Fabric runs in-process, so this is the CLI's own Python). The per-phase breakdown comes from each *ours* run's
``summary.json`` ``"phases"`` ({name: seconds}, in order), where the orchestrator writes it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.nodes import JOBS, REPO, LocalCluster, bring_up, median
from bench.verdicts import Target, attach, describe, shown, verdict

JOB = JOBS / "trivial.py"
SIZES = (8, 16, 32, 64)
QUICK_SIZES = (2, 4)
JUDGED_FROM = 16  # N = 8 is shown, not judged (issue 13: "at N = 16, 32 and 64")
METHODS = ("ours", "pdsh")
NOT_SLOWER = Target("<=", 1.0)  # ours / pdsh, command to exit
TARGET = f"ours / pdsh (trivial job, command to exit) {NOT_SLOWER} at N = 16, 32, 64"
TRIVIAL = re.compile(r"TRIVIAL (\d+) (\d+)")
LOGS = re.compile(r"^\s*logs: (\S+)\s*$", re.MULTILINE)


def ranks_printed(text: str, world_size: int) -> set[int]:
    """The ranks whose ``TRIVIAL <rank> <world size>`` line is in ``text`` with the right world size."""
    return {int(m[1]) for m in TRIVIAL.finditer(text) if int(m[2]) == world_size}  # lines may be prefixed


def phase_medians(samples: list[dict]) -> dict[str, float]:
    """{phase: median seconds} over the runs that report it, in the order the phases first appear."""
    names: list[str] = []
    for sample in samples:
        names += [name for name in (sample.get("phases") or {}) if name not in names]
    return {name: median(s["phases"][name] for s in samples if name in (s.get("phases") or {})) for name in names}


def judged_sizes(sizes: list[int]) -> list[int]:
    """N >= 16; a quick run (N = 2, 4) judges its largest N, so the judging path runs (its page says QUICK)."""
    return [n for n in sizes if n >= JUDGED_FROM] or [max(sizes)]


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
        if any(runner.connect_all().values()):
            raise RuntimeError(f"session rounds at N={cluster.nodes}: a node did not answer")
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


def measure_size(n: int, repeats: int) -> dict:
    """One fresh N-node cluster: up, a syncing warm-up run, ``repeats`` interleaved rounds, down (always)."""
    start = time.monotonic()
    cluster = bring_up(n, "cp")
    up_s = time.monotonic() - start
    print(f"control_plane: cluster {cluster.name} is up ({n} nodes, {up_s:.1f} s)", flush=True)
    samples: dict[str, list[dict]] = {m: [] for m in METHODS}
    try:
        cp = ControlPlane(cluster)
        cp.measure("ours")  # syncs the job to the N nodes (pdsh runs that copy) and warms the page cache: not counted
        for rep in range(repeats):
            for method in METHODS[rep % 2:] + METHODS[:rep % 2]:  # rotate: neither always first
                samples[method].append(cp.measure(method))
        rounds = session_rounds(cluster, repeats)
        rounds.update(connection_rounds(cluster, max(repeats, 5)))
    finally:
        start = time.monotonic()
        cluster.down()
        down_s = time.monotonic() - start
        print(f"control_plane: cluster {cluster.name} is down ({down_s:.1f} s)", flush=True)
    ours, pdsh = (median(s["exited_s"] for s in samples[m]) for m in METHODS)
    row = {"up_s": up_s, "down_s": down_s, "ours_s": ours, "pdsh_s": pdsh, "ours_over_pdsh": ours / pdsh,
           "peak_mib": median(s["peak_mib"] for s in samples["ours"]), "phases": phase_medians(samples["ours"]),
           **rounds}
    return {"row": row, "samples": samples}


def run(cluster: LocalCluster | None = None, quick: bool = False, sizes: tuple[int, ...] | None = None,
        repeats: int | None = None) -> dict:
    """Every N on its own cluster (``cluster``, the shared one of the other sections, is not used)."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    repeats = repeats or (1 if quick else 3)
    rows, samples = {}, {}
    for n in sizes:
        measured = measure_size(n, repeats)
        rows[str(n)], samples[str(n)] = measured["row"], measured["samples"]
    result = {"sizes": list(sizes), "repeats": repeats, "judged": judged_sizes(list(sizes)), "rows": rows,
              "samples": samples, "cores": os.cpu_count()}
    return attach(result, judge(result), TARGET)


def judge(result: dict) -> list[dict]:
    """At each judged N: ours / pdsh on the medians; each interleaved round judged too."""
    out = []
    for n in result["judged"]:
        row, samples = result["rows"][str(n)], result["samples"][str(n)]
        rounds = [(f"round {i + 1}", o["exited_s"] / p["exited_s"])
                  for i, (o, p) in enumerate(zip(samples["ours"], samples["pdsh"]))]
        out.append(verdict(f"control plane N={n}, ours / pdsh (trivial job, median, exited)",
                           row["ours_s"] / row["pdsh_s"], NOT_SLOWER, rounds, "rounds"))
    return out


def section(result: dict) -> str:
    from bench.report import md_table

    sizes = result["sizes"]
    rows = []
    for n in sizes:
        r = result["rows"][str(n)]
        rows.append([str(n), f"{r['up_s']:.2f}", f"{r['ours_s']:.2f}", f"{r['pdsh_s']:.2f}",
                     f"**{shown(r['ours_over_pdsh'], NOT_SLOWER)}**", f"{r['peak_mib']:.0f}", f"{r['down_s']:.2f}"])
    lines = [
        "## Control plane at scale (trivial job)",
        "",
        f"`python -m bench.control_plane`: a fresh cluster of N nodes per row, one process per node, medians of "
        f"{result['repeats']} interleaved round{'s' if result['repeats'] != 1 else ''} (order rotated each round) after one untimed run that syncs the job. "
        "The job prints its rank and exits (no torch). *up* / *down*: `multinode up --nodes N` / `down`; *ours*: "
        "`multinode train --nodes N --script trivial.py` (default launcher), command to exit; *pdsh*: `pdsh -S -R ssh "
        "-f 64` of `cd <synced dir> && RANK=%n WORLD_SIZE=N python trivial.py` on the same nodes; *peak*: the "
        "orchestrator's peak RSS (`ru_maxrss` from `wait4`, in a small parent process).",
        "",
        md_table(["nodes", "up (s)", "ours (s)", "pdsh (s)", "ours / pdsh", "peak (MiB)", "down (s)"], rows),
    ]
    phases: list[str] = []
    for n in sizes:
        phases += [p for p in result["rows"][str(n)]["phases"] if p not in phases]
    if all("session_round_s" in result["rows"][str(n)] for n in sizes):
        alone = all("session_alone_s" in result["rows"][str(n)] for n in sizes)  # measured since 2026-11-23
        cores = result.get("cores") or os.cpu_count() or 1
        cells = []
        for n in sizes:
            r = result["rows"][str(n)]
            cells.append([str(n), f"{r['session_round_s']:.2f}", f"{r['shell_round_s']:.3f}"]
                         + ([f"{r['session_alone_s']:.3f}", f"{n * r['session_alone_s'] / cores:.2f}"] if alone else []))
        text = ("Why one shell per node (`bench.control_plane.session_rounds`): one round of `true` on every node "
                "over open connections, each in a new SSH session (what one exec per command, Fabric's `run`, costs: "
                "the node's sshd starts the login shell and its rc files every time) and in the nodes' persistent "
                "shells")
        if alone:
            text += (f"; and one new session on node-0 alone, with N times that over this host's {cores} cores: what "
                     "N login shells at once take when they only share the cores (median seconds). A round of new "
                     "sessions well above that is login shells waiting for each other: with one home for every "
                     "node, root's `~/.bashrc` here (pyenv's initialisation, whose rehash holds a lock file in the "
                     "home) made them take turns; each local node now logs in to a copy-on-write home of its own "
                     "(`multinode.providers.local.home`), as separate machines do.")
        else:
            text += " (median seconds):"
        lines += ["", text, "", md_table(["nodes", "new session per node (s)", "persistent shell (s)"]
                                         + (["one node alone (s)", "N x alone / cores (s)"] if alone else []), cells)]
    if all("connect_plain_ms" in result["rows"][str(n)] for n in sizes):
        cells = [[str(n), f"{result['rows'][str(n)]['connect_plain_ms']:.1f}",
                  f"{result['rows'][str(n)]['connect_ours_ms']:.1f}"] for n in sizes]
        lines += ["", "One connection, nothing to an open session on node-0 (`bench.control_plane.connection_rounds`, "
                  "one at a time, median milliseconds): with paramiko's own socket, and as "
                  "`multinode.ssh.connect.open_connection` opens it (TCP_NODELAY, quick ACKs re-armed after each read):", "",
                  md_table(["nodes", "paramiko's socket (ms)", "ours (ms)"], cells)]
    if phases:
        cells = [[str(n), *(f"{result['rows'][str(n)]['phases'][p]:.2f}" if p in result["rows"][str(n)]["phases"]
                            else "-" for p in phases)] for n in sizes]
        lines += ["", "Where *ours* spends its time (median seconds per phase, from each run's `summary.json`):", "",
                  md_table(["nodes", *phases], cells)]
    lines += ["", f"Target: {result['target']}. Verdicts (computed by `bench.control_plane.judge`):", "",
              *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result)))]
    return "\n".join(lines) + "\n"


def plot(result: dict, out_dir) -> list:
    from bench.report import lines_by_nodes

    sizes = result["sizes"]
    series = {"ours (train, command to exit)": "ours_s", "pdsh (command to exit)": "pdsh_s", "multinode up": "up_s"}
    return lines_by_nodes(Path(out_dir) / "control_plane.png", sizes,
                          {label: [result["rows"][str(n)][key] for n in sizes] for label, key in series.items()},
                          "seconds (median)", "control plane, trivial job")


if __name__ == "__main__":
    from bench.report import standalone

    standalone("control_plane", nodes=None, run=run, plot=plot)
