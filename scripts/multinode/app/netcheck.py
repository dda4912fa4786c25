"""``make netcheck``: the cluster's network on demand, in one run directory.

1. a matrix of node-to-node bandwidth (iperf3, one flow and several) and round trip, every ordered pair
   (:mod:`multinode.checks.iperf`);
2. an all_reduce sweep with the cluster's own backend (gloo on CPU nodes, NCCL/RCCL on GPU nodes) through a
   normal run of ``training/allreduce_perf.py`` (nccl-tests' busbw), against what the slowest pair's link allows;
3. ``netcheck.json`` (every figure), ``netcheck.md`` (the tables) and ``netcheck.png`` (the plots).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TextIO

from multinode.app.run import Run
from multinode.checks import iperf
from multinode.core.config import LaunchSpec
from multinode.core.errors import MultinodeError, UserError
from multinode.core.inventory import Inventory
from multinode.core.resources import trainer_dir
from multinode.core.state import ClusterState
from multinode.ssh.runner import RemoteRunner

SIZES = [4096 * 4**k for k in range(8)]  # 4 KiB .. 64 MiB
ALLREDUCE_ROW = re.compile(r"ALLREDUCE (\{.*\})")
BUDGET_MB = 256


def netcheck(state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO | None = None) -> Path:
    """Measure, write the run directory's netcheck files, print the tables; returns the directory."""
    out = out or sys.stdout
    inv = replace(inventory, nodes=inventory.nodes[:spec.nodes])  # 2 or more: checked by the verb
    with RemoteRunner(inv, out=out) as runner:
        absent = iperf.missing(runner)
        if absent:
            runner.say(f"no iperf3 on {', '.join(absent)}: the link matrix is left out (install iperf3 on the nodes)")
            pairs = []
        else:
            runner.say(f"link matrix: {len(inv.nodes) * (len(inv.nodes) - 1)} ordered pairs x {len(iperf.FLOWS)} "
                       f"flow counts, {len(iperf.rounds([n.name for n in inv.nodes]))} rounds of disjoint pairs")
            try:
                pairs = iperf.matrix(runner, inv, spec.run_id)
            finally:
                runner.stop_all(spec.run_id)
    rows = collectives(state, inventory, spec, out)
    run_dir = state.run_dir(spec.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    result = {"nodes": [n.name for n in inv.nodes], "pairs": [asdict(p) for p in pairs], "allreduce": rows,
              "link_limit_gbs": link_limit(pairs)}
    (run_dir / "netcheck.json").write_text(json.dumps(result, indent=2) + "\n")
    text = tables(result)
    (run_dir / "netcheck.md").write_text(text)
    plot(result, run_dir / "netcheck.png")
    print(text, file=out)
    print(f"netcheck: {run_dir}/netcheck.{{json,md,png}}", file=out)
    return run_dir


def collectives(state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO) -> list[dict]:
    """The all_reduce sweep as a normal run on the same nodes; its rows from the head's log."""
    gpus = inventory.head.accelerator != "none"
    backend = "nccl" if gpus else "gloo"
    job = replace(spec, mode="gpu" if gpus else "cpu", script=str(trainer_dir() / "allreduce_perf.py"), workdir=None,
                  args=("--backend", backend, "--sizes", ",".join(map(str, SIZES)), "--budget-mb", str(BUDGET_MB)))
    summary = Run(state, inventory, job, out).execute()
    if summary.exit_code:
        raise MultinodeError(f"the all_reduce sweep ended {summary.outcome} (see above); logs in {summary.log_dir}",
                             exit_code=summary.exit_code)
    log = Path(summary.log_dir) / f"{inventory.head.name}.log"
    rows = allreduce_rows(log.read_text())
    if not rows:
        raise UserError(f"the all_reduce sweep printed no result; see {log}")
    return rows


def allreduce_rows(text: str) -> list[dict]:
    """training/allreduce_perf.py's ``ALLREDUCE {...}`` rows, in order, from any output (prefixed or not)."""
    return [json.loads(m[1]) for m in map(ALLREDUCE_ROW.search, text.splitlines()) if m]


def link_limit(pairs: list[iperf.Measured]) -> float | None:
    """What the links allow a ring all_reduce, in GB/s: the slowest ordered pair's best figure over flow counts."""
    best: dict[tuple[str, str], float] = {}
    for p in pairs:
        if p.mbit_s is not None:
            best[(p.src, p.dst)] = max(best.get((p.src, p.dst), 0.0), p.mbit_s)
    return min(best.values()) / 8000 if best else None


def _cell(pairs: list[dict], src: str, dst: str) -> str:
    mine = {p["flows"]: p for p in pairs if p["src"] == src and p["dst"] == dst}
    if not mine:
        return "-"
    rates = " / ".join(f"{mine[f]['mbit_s'] / 1000:.2f}" if mine.get(f, {}).get("mbit_s") else "x" for f in iperf.FLOWS)
    rtts = [p["rtt_ms"] for p in pairs if {p["src"], p["dst"]} == {src, dst} and p["rtt_ms"]]
    return rates + (f" ({statistics.median(rtts):.2f} ms)" if rtts else "")


def size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def tables(result: dict) -> str:
    """The matrix (Gbit/s with 1 / several flows, round trip) and the busbw table, as markdown."""
    names, pairs = result["nodes"], result["pairs"]
    flows = " / ".join(str(f) for f in iperf.FLOWS)
    lines = ["# netcheck", ""]
    if pairs:
        lines += [f"Link bandwidth, Gbit/s with {flows} flow(s) (iperf3, {iperf.SECONDS} s each), and the TCP round trip:",
                  "", "| from \\ to | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines += [f"| {s} | " + " | ".join("" if s == d else _cell(pairs, s, d) for d in names) + " |" for s in names]
        failed = [p for p in pairs if p["error"]]
        lines += [""] + [f"- {p['src']} -> {p['dst']} ({p['flows']} flows): {p['error']}" for p in failed]
    limit = result["link_limit_gbs"]
    lines += ["", f"all_reduce ({result['allreduce'][0]['backend']}, {result['allreduce'][0]['ranks']} ranks), busbw "
              "as nccl-tests computes it" + (f", against the slowest link's {limit:.2f} GB/s:" if limit else ":"), "",
              "| size | time (ms) | algbw (GB/s) | busbw (GB/s) | busbw / link |", "|---:|---:|---:|---:|---:|"]
    for r in result["allreduce"]:
        ratio = f"{r['busbw_gbs'] / limit:.2f}" if limit else "-"
        lines.append(f"| {size(r['bytes'])} | {r['time_s'] * 1000:.3f} | {r['algbw_gbs']:.3f} | {r['busbw_gbs']:.3f} | {ratio} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """The matrix as a heat map (one flow) and busbw against message size with the link's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = result["nodes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    try:
        grid = [[next((p["mbit_s"] / 1000 for p in result["pairs"] if p["src"] == s and p["dst"] == d
                       and p["flows"] == iperf.FLOWS[0] and p["mbit_s"]), float("nan")) for d in names] for s in names]
        image = left.imshow(grid, cmap="viridis")
        left.set_xticks(range(len(names)), names, rotation=45)
        left.set_yticks(range(len(names)), names)
        left.set_title("iperf3, 1 flow (Gbit/s): row sends to column")
        fig.colorbar(image, ax=left)
        rows = result["allreduce"]
        right.plot([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o", label="busbw")
        if result["link_limit_gbs"]:
            right.axhline(result["link_limit_gbs"], color="grey", linestyle="--", label="slowest link")
        right.set_xscale("log", base=2)
        right.set_xlabel("message size (bytes)")
        right.set_ylabel("GB/s")
        right.set_title(f"all_reduce busbw, {rows[0]['backend']}, {rows[0]['ranks']} ranks")
        right.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
