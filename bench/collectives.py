"""Collectives, like nccl-tests' ``all_reduce_perf``: algbw and busbw from 4 KiB to 256 MiB.

    python -m bench.collectives [--quick] [--out-dir docs]     (brings up its own 2-node cluster)

All in one run, 2 nodes of a local cluster, one rank per node, the job ``bench/jobs/allreduce_perf.py``:

* **ours**: the job through ``multinode train --script`` (gloo under torchrun; mpi4py with ``--mode mpi``);
* **raw**: the same job without the orchestrator -- gloo: one process per node started directly in the
  node's namespace with env:// variables (no launcher at all); MPI: the orchestrator's own mpirun line
  (``--dry-run``) typed by hand over ssh on the head;
* **one namespace**: both ranks in node-0's namespace over loopback (MPI over its TCP transport too),
  the ceiling a perfect network would give;
* **link**: iperf3 between the same two nodes (1 flow and 4 flows), in GB/s next to busbw;
* **MTU** (full mode): gloo 64 MiB busbw on fresh 2-node clusters at MTU 1500, 9001 and 65000, each
  against one namespace on the same cluster -- why the local default MTU is 65000.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from bench.jobs.allreduce_perf import bus_bandwidth  # noqa: F401  (the one definition, re-exported)
from bench.nodes import JOBS, LocalCluster, bring_up, median
from bench.verdicts import Target, attach, describe, shown, verdict
from multinode.core.config import DEFAULT_MTU

JOB = JOBS / "allreduce_perf.py"
ROW = re.compile(r"ALLREDUCE (\{.*\})")
FULL_SIZES = [4096 * 4**k for k in range(9)]  # 4 KiB .. 256 MiB
QUICK_SIZES = [4096, 65536, 1 << 20]
MIB64 = 64 << 20
LARGE = 1 << 20  # sizes from here up are bandwidth-bound
MTUS = (1500, 9001, DEFAULT_MTU)  # Ethernet's default; EC2's jumbo frames inside a VPC; the local default
TARGET_VS_ONE_NS = 0.85
OURS_VS_RAW = Target(">=", 0.95)  # the orchestrator costs at most 5% of the bandwidth of the same job run raw
DEFAULT_VS_ONE_NS = Target(">=", TARGET_VS_ONE_NS)
TARGET = (f"ours / raw busbw {OURS_VS_RAW} per backend at the largest size; 2 namespaces / one namespace "
          f"{DEFAULT_VS_ONE_NS} at the default MTU")
VARIANTS = ("ours", "raw", "one-namespace")


def parse_rows(text: str) -> list[dict]:
    """The job's ``ALLREDUCE {...}`` rows (from any output, prefixed or not), in order."""
    return [json.loads(m[1]) for m in map(ROW.search, text.splitlines()) if m]


def _job_args(backend: str, sizes: list[int], budget_mb: float) -> list[str]:
    return [str(JOB), "--backend", backend, "--sizes", ",".join(map(str, sizes)), "--budget-mb", str(budget_mb)]


def ours(cluster: LocalCluster, backend: str, sizes: list[int], budget_mb: float) -> list[dict]:
    job, *args = _job_args(backend, sizes, budget_mb)
    mode = "mpi" if backend == "mpi" else "cpu"
    res = cluster.cli("train", "--nodes", "2", "--mode", mode, "--script", job, f"--args={' '.join(args)}")
    return parse_rows(res.stdout)


def _python_env(extra: dict[str, str]) -> list[str]:
    return ["env", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1", *(f"{k}={v}" for k, v in extra.items())]


def _run_all(argvs: list[list[str]], timeout: float = 900) -> list[str]:
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a in argvs]
    outs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        if proc.returncode != 0:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{' '.join(proc.args)} failed ({proc.returncode}):\n{out[-3000:]}")
        outs.append(out)
    return outs


def raw_gloo(cluster: LocalCluster, sizes: list[int], budget_mb: float, one_namespace: bool = False,
             port: int = 29611) -> list[dict]:
    """gloo with no launcher: one process per rank started in a namespace with env:// variables."""
    argvs = []
    for rank in range(2):
        node = 0 if one_namespace else rank
        env = {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": 0, "MASTER_PORT": port,
               "MASTER_ADDR": "127.0.0.1" if one_namespace else cluster.ip(0),
               "GLOO_SOCKET_IFNAME": "lo" if one_namespace else "eth0"}
        argvs.append(["ip", "netns", "exec", cluster.netns(node), *_python_env({k: str(v) for k, v in env.items()}),
                      sys.executable, *_job_args("gloo", sizes, budget_mb)])
    return parse_rows(_run_all(argvs)[0])


def raw_mpi(cluster: LocalCluster, sizes: list[int], budget_mb: float) -> list[dict]:
    """The orchestrator's mpirun line, typed by hand over ssh on the head (after writing its hostfile)."""
    job, *args = _job_args("mpi", sizes, budget_mb)
    run_id, shells = cluster.shells("--nodes", "2", "--mode", "mpi", "--script", job, f"--args={' '.join(args)}")
    hostfile = cluster.workdir(0) / "runs" / run_id / "hostfile"
    prep = f"mkdir -p {hostfile.parent} && printf '%s slots=1\\n' {cluster.ip(0)} {cluster.ip(1)} > {hostfile}"
    subprocess.run(cluster.ssh(0, prep), check=True, timeout=30)
    run = cluster.run_by_hand(shells, run_id)
    if not run.ok:
        raise RuntimeError(f"hand-typed mpirun failed:\n{run.failure()}")
    return parse_rows(run.text())


def one_namespace_mpi(cluster: LocalCluster, sizes: list[int], budget_mb: float) -> list[dict]:
    """Two MPI ranks in node-0's namespace over Open MPI's TCP transport on loopback."""
    argv = ["ip", "netns", "exec", cluster.netns(0), *_python_env({"OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
            "mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
            "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            sys.executable, *_job_args("mpi", sizes, budget_mb)]
    return parse_rows(_run_all([argv])[0])


def iperf3(cluster: LocalCluster, seconds: float, flows: int = 1, port: int = 5211) -> float:
    """node-0 -> node-1 TCP throughput in GB/s (what the receiver got)."""
    server = subprocess.Popen(["ip", "netns", "exec", cluster.netns(1), "iperf3", "-s", "-1", "-B", cluster.ip(1),
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the server listens, with a deadline
            probe = subprocess.run(["ip", "netns", "exec", cluster.netns(1), "ss", "-Hltn", f"sport = :{port}"],
                                   capture_output=True, text=True)
            if probe.stdout.strip():
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"iperf3 -s on node-1 is not listening on port {port} (exit {server.poll()})")
            time.sleep(0.1)
        res = subprocess.run(["ip", "netns", "exec", cluster.netns(0), "iperf3", "-c", cluster.ip(1), "-B", cluster.ip(0),
                              "-p", str(port), "-t", str(seconds), "-P", str(flows), "-J"],
                             capture_output=True, text=True, timeout=seconds + 30)
        if res.returncode != 0:
            raise RuntimeError(f"iperf3 failed: {res.stdout[-1000:]} {res.stderr[-1000:]}")
        return json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        server.kill()
        server.wait()


def _at(rows: list[dict], nbytes: int) -> dict | None:
    return next((r for r in rows if r["bytes"] == nbytes), None)


def mtu_sweep(mtus=MTUS, repeats: int = 3, budget_mb: float = 1024) -> list[dict]:
    """gloo 64 MiB busbw across two namespaces vs in one namespace, on a fresh cluster per MTU."""
    out = []
    for mtu in mtus:
        cluster = bring_up(2, "bmtu", mtu=mtu)
        try:
            pairs = []
            for _ in range(repeats):  # interleaved, so drift hits both sides alike
                two = _at(raw_gloo(cluster, [MIB64], budget_mb), MIB64)["busbw_gbs"]
                one = _at(raw_gloo(cluster, [MIB64], budget_mb, one_namespace=True), MIB64)["busbw_gbs"]
                pairs.append((two, one))
            two, one = median(p[0] for p in pairs), median(p[1] for p in pairs)
            out.append({"mtu": mtu, "busbw_gbs": two, "one_namespace_busbw_gbs": one, "ratio": two / one,
                        "link_gbs": iperf3(cluster, 2)})
        finally:
            cluster.down()
    return out


def default_mtu_verdict(sweep: list[dict]) -> str:
    """Whether the local provider's default MTU reached the target fraction of one namespace in this sweep."""
    row = next((m for m in sweep if m["mtu"] == DEFAULT_MTU), None)
    if row is None:
        return f"the default MTU {DEFAULT_MTU} was not measured"
    met = "met" if DEFAULT_VS_ONE_NS.met(row["ratio"]) else "NOT met"
    return f"the default MTU {DEFAULT_MTU} reached {shown(row['ratio'], DEFAULT_VS_ONE_NS)} x one namespace: target {met}"


def best_per_size(sweeps: list[list[dict]]) -> list[dict]:
    """Per size, the row with the highest busbw over repeated sweeps (other load only ever slows a sweep)."""
    return [max(rows, key=lambda r: r["busbw_gbs"]) for rows in zip(*sweeps)]


def run(cluster: LocalCluster, quick: bool = False, sweep_mtu: bool | None = None) -> dict:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    budget = 16 if quick else 1024
    repeats = 1 if quick else 2
    measure = {
        "gloo": {"ours": lambda: ours(cluster, "gloo", sizes, budget), "raw": lambda: raw_gloo(cluster, sizes, budget),
                 "one-namespace": lambda: raw_gloo(cluster, sizes, budget, one_namespace=True)},
        "mpi": {"ours": lambda: ours(cluster, "mpi", sizes, budget), "raw": lambda: raw_mpi(cluster, sizes, budget),
                "one-namespace": lambda: one_namespace_mpi(cluster, sizes, budget)},
    }
    sweeps: dict[str, dict[str, list]] = {b: {v: [] for v in variants} for b, variants in measure.items()}
    for _ in range(repeats):  # interleaved: ours, raw, one namespace, ours, raw, ...
        for backend, variants in measure.items():
            for name, sweep in variants.items():
                rows = sweep()
                if len(rows) != len(sizes):
                    raise RuntimeError(f"{backend} {name}: expected {len(sizes)} sizes, got {len(rows)} rows")
                sweeps[backend][name].append(rows)
    series = {b: {v: best_per_size(s) for v, s in variants.items()} for b, variants in sweeps.items()}
    seconds = 1 if quick else 3
    link = {"1 flow": iperf3(cluster, seconds, 1), "4 flows": iperf3(cluster, seconds, 4)}
    result = {"nodes": 2, "ranks_per_node": 1, "mtu": cluster.inventory.extra.get("mtu"), "sizes": sizes,
              "budget_mb_per_size": budget, "repeats": repeats, "series": series, "link_gbs": link,
              "link_limit_gbs": max(link.values())}
    if sweep_mtu if sweep_mtu is not None else not quick:
        result["mtu_sweep"] = mtu_sweep()
    return attach(result, judge(result), TARGET)


def judge(result: dict) -> list[dict]:
    """ours / raw per backend at the largest size (each size from 1 MiB up judged too), and the
    default MTU's 2 namespaces / one namespace ratio when the sweep ran."""
    big = max(result["sizes"])
    out = []
    for backend, variants in result["series"].items():
        ours_, raw_ = (_at(variants[v], big)["busbw_gbs"] for v in ("ours", "raw"))
        sizes = [(_size(o["bytes"]), o["busbw_gbs"] / r["busbw_gbs"]) for o, r in zip(variants["ours"], variants["raw"])
                 if o["bytes"] >= LARGE]
        out.append(verdict(f"collectives {backend}: ours / raw busbw at {_size(big)}", ours_ / raw_, OURS_VS_RAW,
                           sizes, "sizes from 1 MiB up"))
    row = next((m for m in result.get("mtu_sweep", ()) if m["mtu"] == result["mtu"]), None)
    if row is not None:
        out.append(verdict(f"collectives gloo 64 MiB: 2 namespaces / one namespace at the default MTU {row['mtu']}",
                           row["ratio"], DEFAULT_VS_ONE_NS))
    return out


def ratios(result: dict) -> dict:
    """Per backend at the largest size: ours/raw, ours/one-namespace, busbw/link; and ours/raw as the
    median over every size from 1 MiB up (one noisy size moves it less than it moves the largest)."""
    big = max(result["sizes"])
    out = {}
    for backend, variants in result["series"].items():
        ours_, raw_, one = (_at(variants[v], big)["busbw_gbs"] for v in VARIANTS)
        large = [(o["busbw_gbs"], r["busbw_gbs"]) for o, r in zip(variants["ours"], variants["raw"])
                 if o["bytes"] >= LARGE] or [(ours_, raw_)]
        out[backend] = {"bytes": big, "ours_over_raw": ours_ / raw_, "ours_over_one_namespace": ours_ / one,
                        "busbw_over_link": ours_ / result["link_limit_gbs"],
                        "ours_over_raw_median_large": median(o / r for o, r in large)}
    return out


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def section(result: dict) -> str:
    from bench.report import md_table

    link = result["link_gbs"]
    lines = [
        "## Collectives (all_reduce, like nccl-tests `all_reduce_perf`)",
        "",
        f"`python -m bench.collectives`: {result['nodes']} nodes x {result['ranks_per_node']} rank, float32 sum in place, "
        f"MTU {result['mtu']}, about {result['budget_mb_per_size']:.0f} MB moved per size (3..50 calls, 5 warm-up); "
        "time = slowest rank's mean per call; algbw = bytes / time, busbw = algbw x 2(n-1)/n; GB = 1e9 bytes; "
        f"best of {result.get('repeats', 1)} interleaved sweep(s) per size. "
        "*ours* = through `multinode train --script` (gloo: torchrun; MPI: `--mode mpi`); *raw* = gloo started "
        "directly in each node's namespace with env:// variables (no launcher), MPI = the orchestrator's mpirun "
        "line typed by hand over ssh; *one ns* = both ranks in one namespace over loopback. "
        f"Link (iperf3 node-0 -> node-1, same run): {link['1 flow']:.2f} GB/s with 1 flow, "
        f"{link['4 flows']:.2f} GB/s with 4 flows.",
        "",
    ]
    for backend, variants in result["series"].items():
        rows = []
        for nbytes in result["sizes"]:
            cells = [_at(variants[v], nbytes) for v in VARIANTS]
            rows.append([_size(nbytes), *(f"{c['algbw_gbs']:.3f}" for c in cells[:1]),
                         *(f"{c['busbw_gbs']:.3f}" for c in cells),
                         shown(cells[0]['busbw_gbs'] / cells[1]['busbw_gbs'], OURS_VS_RAW),
                         f"{cells[0]['busbw_gbs'] / result['link_limit_gbs']:.2f}"])
        lines += [f"### {backend}" + (" (mpi4py)" if backend == "mpi" else " (torch.distributed)"), "",
                  md_table(["size", "algbw ours", "busbw ours", "busbw raw", "busbw one ns", "ours / raw",
                            "busbw / link"], rows), ""]
    summary = ratios(result)
    lines.append("At the largest size: " + "; ".join(
        f"{b}: ours / raw **{shown(r['ours_over_raw'], OURS_VS_RAW)}** (median over 1 MiB and up: "
        f"{shown(r['ours_over_raw_median_large'], OURS_VS_RAW)}), ours / one namespace "
        f"**{r['ours_over_one_namespace']:.2f}**, busbw / link {r['busbw_over_link']:.2f}" for b, r in summary.items()) + ".")
    lines += ["", "Verdicts (computed from the figures above by `bench.collectives.judge`):", ""]
    lines += [f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))]
    if "mtu_sweep" in result:
        rows = [[str(m["mtu"]), f"{m['link_gbs']:.2f}", f"{m['busbw_gbs']:.3f}", f"{m['one_namespace_busbw_gbs']:.3f}",
                 f"**{m['ratio']:.2f}**"] for m in result["mtu_sweep"]]
        lines += ["", "### MTU: gloo 64 MiB busbw across namespaces vs one namespace", "",
                  "A fresh 2-node cluster per MTU, raw gloo, median of 3 interleaved pairs; target for the default: "
                  f">= {TARGET_VS_ONE_NS} x one namespace.", "",
                  md_table(["MTU", "link (GB/s, 1 flow)", "busbw 2 ns", "busbw one ns", "ratio"], rows), "",
                  f"In this run **{default_mtu_verdict(result['mtu_sweep'])}**. 1500 is Ethernet's MTU and 9001 EC2's "
                  "jumbo frames; on veth pairs inside one kernel the MTU only sets how many packets the host's CPU "
                  "handles, so the local provider defaults to the large one (`MTU=1500` to try Ethernet-sized packets)."]
    return "\n".join(lines) + "\n"


def plot(result: dict, out_dir) -> list:
    from bench.report import figure

    paths = [out_dir / "collectives.png"]
    with figure(paths[0], ncols=len(result["series"]), figsize=(11, 4), sharey=True) as (_, axes):
        for ax, (backend, variants) in zip(axes, result["series"].items()):
            for name in VARIANTS:
                rows = variants[name]
                ax.plot([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o", label=name)
            ax.axhline(result["link_limit_gbs"], color="grey", linestyle="--", label="link (iperf3)")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("message size (bytes)")
            ax.set_title(f"all_reduce busbw, {backend}, 2 nodes")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("busbw (GB/s)")
        axes[0].legend()
    if "mtu_sweep" in result:
        sweep = result["mtu_sweep"]
        paths.append(out_dir / "collectives_mtu.png")
        with figure(paths[-1], figsize=(6, 4)) as (_, ax):
            x = range(len(sweep))
            ax.bar([i - 0.2 for i in x], [m["busbw_gbs"] for m in sweep], width=0.4, label="2 namespaces")
            ax.bar([i + 0.2 for i in x], [m["one_namespace_busbw_gbs"] for m in sweep], width=0.4, label="one namespace")
            ax.set_xticks(list(x), [f"MTU {m['mtu']}" for m in sweep])
            ax.set_ylabel("gloo 64 MiB busbw (GB/s)")
            ax.legend()
    return paths


if __name__ == "__main__":
    from bench.report import standalone

    standalone("collectives", nodes=2, run=run, plot=plot)
