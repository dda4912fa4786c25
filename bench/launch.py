"""Launch overhead: from the command to all ranks rendezvoused, and to all exited, for N = 2, 4, 8 nodes.

    python -m bench.launch [--quick] [--out-dir docs]     (brings up its own 8-node cluster; quick: 2)

The job (``bench/jobs/hello_rdzv.py``) joins a gloo process group, does one barrier, prints the wall
clock and exits; one process per node. Four ways to start it, repeated and interleaved in one run:

* **ours**: ``python -m multinode train --nodes N --script hello_rdzv.py`` -- the whole CLI: start-up,
  pre-flight, code sync, launch, line prefixes, the sweep and the summary;
* **pdsh + torchrun**: DeepSpeed's method -- one ``pdsh -R ssh`` fanning out a static-rendezvous
  torchrun line (``--node-rank=%n --master-addr=<head>``) to every node;
* **serial ssh**: a shell loop starting ``ssh node-i 'torchrun ... --node-rank=i'`` in the background, one
  node after another, then ``wait``;
* **torchrun --standalone**: the same world size on the head alone (one ssh): a floor with no network fan-out.

The baselines run the code the orchestrator synced (they get no sync of their own, like a shared
home directory would give them). Rendezvoused = the last rank's barrier exit (the nodes share a clock).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time

from bench.nodes import JOBS, REPO, LocalCluster, median
from bench.verdicts import Target, attach, describe, paired, shown

JOB = JOBS / "hello_rdzv.py"
RDZV = re.compile(r"RDZV (\d+) (\d+\.\d+)")
METHODS = ("ours", "ours, LAUNCHER=static", "pdsh + torchrun", "serial ssh", "torchrun --standalone")
TARGET = "ours <= pdsh + torchrun (command to all exited)"
NOT_SLOWER = Target("<=", 1.0)  # ours / pdsh + torchrun, command to all exited
JUDGED = {"ours, LAUNCHER=static": "default (LAUNCHER=static)", "ours": "LAUNCHER=torchrun (agents)"}


def rendezvous_times(text: str) -> dict[int, float]:
    """{rank: unix time of its barrier exit} from any launcher's output."""
    return {int(m[1]): float(m[2]) for m in RDZV.finditer(text)}  # not per line: lines may interleave


class Launch:
    """One cluster's launch commands (the baselines are built from the inventory alone)."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.port = 29700
        inv = cluster.inventory
        self.python = inv.interpreter
        self.code = cluster.workdir(0).parent / "{node}" / "code"  # same layout on every node
        self.ssh_opts = (f"-i {inv.ssh_key} -o UserKnownHostsFile={inv.known_hosts} -o StrictHostKeyChecking=yes "
                         f"-o BatchMode=yes -o LogLevel=ERROR -p {inv.head.ssh_port}")
        self.user = inv.head.ssh_user
        self.iface = f"$(ip -o -4 addr show to {inv.subnet} | awk 'NR==1{{print $2}}')"

    def _next_port(self) -> int:
        self.port += 1
        return self.port

    def torchrun_line(self, n: int, node_rank: str, local_addr: str, port: int, workdir: str) -> str:
        """The static-rendezvous torchrun line of every baseline (env as the orchestrator sets it)."""
        argv = [self.python, "-m", "torch.distributed.run", f"--nnodes={n}", "--nproc-per-node=1",
                f"--node-rank={node_rank}", f"--master-addr={self.cluster.ip(0)}", f"--master-port={port}",
                f"--local-addr={local_addr}", "project/hello_rdzv.py"]
        return (f"cd {workdir} && export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=\"{self.iface}\" "
                f"&& exec {shlex.join(argv)}")

    @staticmethod
    def _train(n: int, launcher: str) -> list[str]:
        return [sys.executable, "-m", "multinode", "train", "--nodes", str(n), "--script", str(JOB), "--launcher", launcher]

    def ours(self, n: int) -> list[str]:
        return self._train(n, "torchrun")  # agents on every node: what MAX_RESTARTS/ELASTIC jobs use

    def ours_static(self, n: int) -> list[str]:
        return self._train(n, "static")  # the default for a fixed-size job (LAUNCHER=auto)

    def pdsh(self, n: int) -> list[str]:
        # %n: pdsh's rank of the host in the (sorted) -w list; %h: the host as given, here its cluster IP.
        hosts = ",".join(self.cluster.ip(i) for i in range(n))
        workdir = str(self.code).replace("{node}", "node-$(( $(hostname | sed 's/.*-//') ))")
        line = self.torchrun_line(n, "%n", "%h", self._next_port(), workdir)
        return ["pdsh", "-R", "ssh", "-l", self.user, "-w", hosts, line]

    def serial_ssh(self, n: int) -> list[str]:
        port = self._next_port()
        parts = []
        for i in range(n):
            line = self.torchrun_line(n, str(i), self.cluster.ip(i), port, str(self.code).replace("{node}", f"node-{i}"))
            parts.append(f"ssh {self.ssh_opts} {self.user}@{self.cluster.ip(i)} {shlex.quote(line)} &")
        return ["bash", "-c", " ".join(parts) + " wait"]

    def standalone(self, n: int) -> list[str]:
        workdir = str(self.code).replace("{node}", "node-0")
        argv = [self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "project/hello_rdzv.py"]
        line = f"cd {workdir} && export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 && exec {shlex.join(argv)}"
        return ["ssh", *self.ssh_opts.split(), f"{self.user}@{self.cluster.ip(0)}", line]

    def env(self, method: str) -> dict[str, str]:
        env = self.cluster.env()
        if method == "pdsh + torchrun":
            env["PDSH_SSH_ARGS_APPEND"] = self.ssh_opts
        return env

    def measure(self, method: str, n: int, timeout: float = 300) -> dict:
        argv = {"ours": self.ours, "ours, LAUNCHER=static": self.ours_static, "pdsh + torchrun": self.pdsh,
                "serial ssh": self.serial_ssh, "torchrun --standalone": self.standalone}[method](n)
        start = time.time()
        res = subprocess.run(argv, cwd=REPO, env=self.env(method), capture_output=True, text=True, timeout=timeout)
        exited = time.time() - start
        out = res.stdout + res.stderr
        times = rendezvous_times(out)
        if res.returncode != 0 or len(times) != n:
            raise RuntimeError(f"{method} at N={n}: exit {res.returncode}, {len(times)}/{n} ranks rendezvoused:\n{out[-3000:]}")
        return {"rendezvoused_s": max(times.values()) - start, "exited_s": exited}


def run(cluster: LocalCluster, quick: bool = False, sizes: tuple[int, ...] | None = None, repeats: int | None = None) -> dict:
    sizes = sizes or ((2,) if quick else (2, 4, 8))
    repeats = repeats or (1 if quick else 3)
    launch = Launch(cluster)
    samples: dict[int, dict[str, list[dict]]] = {n: {m: [] for m in METHODS} for n in sizes}
    for n in sizes:
        if not quick:  # a first run syncs the job to the N nodes and warms the page cache: not counted
            launch.measure("ours", n)
        for rep in range(repeats):
            # "ours" comes first in round 0: in quick mode its run is also the one that syncs the job.
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]  # rotate: no method always first
            for method in order:
                samples[n][method].append(launch.measure(method, n))
    table = {}
    for n in sizes:
        table[n] = {m: {"rendezvoused_s": median(s["rendezvoused_s"] for s in samples[n][m]),
                        "exited_s": median(s["exited_s"] for s in samples[n][m])} for m in METHODS}
        table[n]["ours_over_pdsh_exited"] = median(round_ratios(samples[n], "ours"))
        table[n]["static_over_pdsh_exited"] = median(round_ratios(samples[n], "ours, LAUNCHER=static"))
    result = {"sizes": list(sizes), "repeats": repeats, "medians": {str(n): v for n, v in table.items()},
              "samples": {str(n): v for n, v in samples.items()}}
    return attach(result, judge(result), TARGET)


def round_ratios(samples: dict[str, list[dict]], method: str) -> list[float]:
    """``method`` / pdsh + torchrun (exited) of each interleaved round."""
    return [s["exited_s"] / p["exited_s"] for s, p in zip(samples[method], samples["pdsh + torchrun"])]


def judge(result: dict) -> list[dict]:
    """Per node count, ours (both launchers) / pdsh + torchrun by the one rule (bench.verdicts.paired) on the rounds."""
    out = []
    for n in result["sizes"]:
        samples = result["samples"][str(n)]
        for method, label in JUDGED.items():
            rounds = [(f"round {i + 1}", r) for i, r in enumerate(round_ratios(samples, method))]
            out.append(paired(f"launch N={n}, {label} / pdsh + torchrun (median of rounds, exited)", rounds,
                              NOT_SLOWER, "rounds"))
    return out


def section(result: dict) -> str:
    from bench.report import md_table

    rows = []
    for n in result["sizes"]:
        row = result["medians"][str(n)]
        cells = [f"{row[m]['rendezvoused_s']:.2f} / {row[m]['exited_s']:.2f}" for m in METHODS]
        samples = result["samples"][str(n)]
        rows.append([str(n), *cells, *(f"**{shown(median(round_ratios(samples, m)), NOT_SLOWER)}**"
                                       for m in ("ours", "ours, LAUNCHER=static"))])
    return "\n".join([
        "## Launch overhead (hello job)",
        "",
        f"`python -m bench.launch`: one process per node, medians of {result['repeats']} interleaved runs per cell "
        "(method order rotated each round). Each cell: seconds from the command to all ranks rendezvoused / to the "
        "command's exit. *ours* is the full `multinode train --script` (CLI start-up, pre-flight, code sync, launch, "
        "sweep, summary) with torchrun's agents (LAUNCHER=torchrun, what MAX_RESTARTS/ELASTIC jobs use); "
        "*LAUNCHER=static* -- the default for a fixed-size job -- is the same without agents (the "
        "orchestrator starts each rank with the env:// variables itself); *pdsh + torchrun* is DeepSpeed's method (`pdsh -R ssh` of a static-rendezvous torchrun line, "
        "`--node-rank=%n`); *serial ssh* starts `ssh node torchrun ...` in the background node after node and waits; "
        "*torchrun --standalone* runs the same world size on the head alone. The baselines reuse the code the "
        "orchestrator synced.",
        "",
        md_table(["nodes", *METHODS, "ours / pdsh (exited, median of rounds)", "static / pdsh (exited, median of rounds)"], rows),
        "",
        f"Target: {result['target']}, i.e. a ratio {NOT_SLOWER}. Verdicts (computed by `bench.launch.judge`):",
        "",
        *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))),
    ]) + "\n"


def plot(result: dict, out_dir) -> list:
    from bench.report import lines_by_nodes

    sizes = result["sizes"]
    return lines_by_nodes(out_dir / "launch.png", sizes,
                          {m: [result["medians"][str(n)][m]["exited_s"] for n in sizes] for m in METHODS},
                          "command to all exited (s, median)", "launch overhead, hello job")


if __name__ == "__main__":
    from bench.report import standalone

    standalone("launch", nodes=8, run=run, plot=plot)
