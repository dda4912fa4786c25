"""Training throughput: ``make train`` vs the seed's torchrun line typed by hand on each node.

    python -m bench.throughput [--quick] [--out-dir docs]     (brings up its own 2-node cluster)

Both sides run our trainer on 2 nodes x 1 process with the same arguments (the MLP workload of
``bench.mpi_vs_ddp``: random data, so no dataset I/O). *ours* goes through ``python -m multinode train``
(what ``make train`` runs). *by hand* is what the seed's users type on every node (:func:`seed_lines`):

    torchrun --nproc-per-node=1 --nnodes=N --node-rank=i --rdzv-id=<id> --rdzv-backend=c10d \
             --rdzv-endpoint=<head>:29603 training/train.py <args>

built here from the inventory alone (each node's address, code directory and interpreter), not from the
orchestrator's planner, and run over plain ssh on every node at once (one session per node). It gets the
code ours synced (as a shared home would give it) and ``OMP_NUM_THREADS=1``, which ours sets too: the simulated
nodes share one machine's cores, and without it both nodes' torch would run a thread per core, measuring
that, not the launcher. samples/s comes from rank 0's ``metrics.jsonl`` (median over epochs, epoch 0 left out
as warm-up); the two sides alternate, repeated. Results recorded before issue 38 ran, as *by hand*, the line
the orchestrator's ``--dry-run`` prints, so their ratio near 1 was built in: their pairs are flagged, not counted.
"""

from __future__ import annotations

import json
import shlex
import statistics
import uuid
from pathlib import Path

from bench.nodes import LocalCluster, median
from bench.verdicts import Target, attach, describe, paired, pairs_needed, shown, wrong_side

AS_FAST = Target(">=", 0.98)  # ours / by hand, samples/s
TARGET = f"ours / by hand (samples/s) {AS_FAST}"
RDZV_PORT = 29603  # the seed's --rdzv-endpoint=<head>:29603
SEED = "the seed's torchrun line on each node"  # the baseline of results that record one (``baseline``)
# How many pairs (bench.verdicts.pairs_needed): the pairs recorded at commit 4f92352 (0.984, 1.101, 1.067; two later
# sittings' medians were 1.01 and 1.07) scatter about 1.05 with a standard deviation of 0.06, so a pair falls under
# 0.98 about one time in eight; 3 pairs made the verdict flip between runs of one commit, 16 keep it from missing
# "met" more than one time in twenty.
RECORDED = (0.984, 1.101, 1.067)
PAIRS = pairs_needed(wrong_side(statistics.mean(RECORDED), statistics.stdev(RECORDED), AS_FAST))


def train_args(quick: bool) -> str:
    epochs, steps = (1, 5) if quick else (4, 40)
    return f"--workload mlp --batch-size 64 --steps-per-epoch {steps} {epochs} 1000"


def samples_per_s(metrics: Path) -> float:
    """Median samples/s over epochs (epoch 0 left out when there are more)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [r for r in rows if "epoch" in r and "samples_per_s" in r]
    if not epochs:
        raise ValueError(f"{metrics} has no per-epoch rows")
    return median(r["samples_per_s"] for r in (epochs[1:] or epochs))


def ours(cluster: LocalCluster, args: str) -> float:
    res = cluster.cli("train", "--nodes", "2", f"--args={args}")
    metrics = next(line.split(":", 1)[1].strip() for line in res.stdout.splitlines() if line.strip().startswith("metrics:"))
    return samples_per_s(Path(metrics))


def seed_lines(cluster: LocalCluster, run_id: str, args: str, nodes: int = 2) -> dict[str, str]:
    """{node: shell line}: the seed's hand-typed torchrun on each node, from the inventory alone (the node's code
    directory, the head's address, the interpreter's torchrun); ``--metrics-dir`` only so samples/s can be read."""
    inv = cluster.inventory
    torchrun = str(Path(inv.interpreter).with_name("torchrun")) if "/" in inv.interpreter else "torchrun"
    lines = {}
    for i in range(nodes):
        workdir = cluster.workdir(i)
        argv = [torchrun, "--nproc-per-node=1", f"--nnodes={nodes}", f"--node-rank={i}", f"--rdzv-id={run_id}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={cluster.ip(0)}:{RDZV_PORT}", "training/train.py",
                "--metrics-dir", str(workdir / "runs" / run_id), *shlex.split(args)]
        lines[f"node-{i}"] = f"cd {shlex.quote(str(workdir / 'code'))} && export OMP_NUM_THREADS=1 && {shlex.join(argv)}"
    return lines


def rank0_metrics(cluster: LocalCluster, run_id: str, nodes: int = 2) -> Path:
    """The one metrics.jsonl of a hand run: rank 0's, on whichever node c10d gave rank 0 (it ignores --node-rank)."""
    found = [m for i in range(nodes) if (m := cluster.workdir(i) / "runs" / run_id / "metrics.jsonl").exists()]
    if len(found) != 1:
        raise RuntimeError(f"hand-typed run {run_id}: expected rank 0's metrics.jsonl on one node, found {found}")
    return found[0]


def by_hand(cluster: LocalCluster, args: str) -> float:
    run_id = f"hand-{uuid.uuid4().hex[:8]}"
    run = cluster.run_by_hand(seed_lines(cluster, run_id, args), run_id)
    if not run.ok:
        raise RuntimeError(f"hand-typed torchrun failed:\n{run.failure()}")
    return samples_per_s(rank0_metrics(cluster, run_id))


def run(cluster: LocalCluster, quick: bool = False) -> dict:
    args = train_args(quick)
    repeats = 1 if quick else PAIRS
    pairs = []
    for rep in range(repeats):
        first, second = (ours, by_hand) if rep % 2 == 0 else (by_hand, ours)
        a, b = first(cluster, args), second(cluster, args)
        pairs.append({"ours": a, "by_hand": b} if first is ours else {"ours": b, "by_hand": a})
    o, h = median(p["ours"] for p in pairs), median(p["by_hand"] for p in pairs)
    result = {"nodes": 2, "nproc": 1, "args": args, "repeats": repeats, "pairs": pairs, "ours_samples_per_s": o,
              "by_hand_samples_per_s": h, "ratio": pair_median(pairs), "baseline": SEED,
              "head_command": seed_lines(cluster, "<id>", args)["node-0"]}
    return attach(result, judge(result), TARGET)


def pair_median(pairs: list[dict]) -> float:
    return median(p["ours"] / p["by_hand"] for p in pairs)


def judge(result: dict) -> list[dict]:
    """The one rule (bench.verdicts.paired) on the alternating pairs; a result whose baseline was the
    orchestrator's own dry-run line (no ``baseline`` recorded) has every pair flagged, not counted."""
    pairs = [(f"pair {i + 1}", p["ours"] / p["by_hand"]) for i, p in enumerate(result["pairs"])]
    if result.get("baseline") == SEED:
        return [paired("throughput, `make train` / the seed's torchrun typed on each node (median of pairs)", pairs,
                       AS_FAST)]
    why = "the baseline ran the orchestrator's own dry-run line, not the seed's hand-typed one"
    return [paired("throughput, `make train` / torchrun by hand (median of pairs)", [], AS_FAST,
                   flagged=[(label, r, why) for label, r in pairs])]


def section(result: dict) -> str:
    from bench.report import md_table

    rows = [[str(i + 1), f"{p['ours']:.0f}", f"{p['by_hand']:.0f}", shown(p['ours'] / p['by_hand'], AS_FAST, 3)]
            for i, p in enumerate(result["pairs"])]
    rows.append(["median", f"{result['ours_samples_per_s']:.0f}", f"{result['by_hand_samples_per_s']:.0f}",
                 f"**{shown(pair_median(result['pairs']), AS_FAST, 3)}** (median of pairs)"])
    return "\n".join([
        "## Training throughput: `make train` vs torchrun by hand",
        "",
        f"`python -m bench.throughput`: {result['nodes']} nodes x {result['nproc']} process, trainer arguments "
        f"`{result['args']}`, gloo DDP; samples/s (global) = median over epochs from rank 0's metrics.jsonl, epoch 0 "
        f"left out; {result['repeats']} alternating pairs ({PAIRS} needed: `bench.throughput.PAIRS`, from the "
        "pairs' recorded spread). *by hand* runs, over plain ssh on each node, "
        + ("the seed's torchrun line, built from the inventory alone (not by our planner), e.g. on the head:"
           if result.get("baseline") == SEED else
           "the line the orchestrator's `--dry-run` prints (recorded before issue 38: a ratio near 1 is built in), "
           "e.g. on the head:"),
        "",
        "```",
        result["head_command"],
        "```",
        "",
        md_table(["pair", "ours (samples/s)", "by hand (samples/s)", "ours / by hand"], rows),
        "",
        f"Target: {TARGET}. Verdict (computed by `bench.throughput.judge`):",
        "",
        *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))),
    ]) + "\n"


def plot(result: dict, out_dir) -> list:
    from bench.report import figure

    path = out_dir / "throughput.png"
    with figure(path, figsize=(5, 4)) as (_, ax):
        ax.bar(["make train", "torchrun by hand"], [result["ours_samples_per_s"], result["by_hand_samples_per_s"]])
        ax.set_ylabel("samples/s (median)")
        ax.set_title(f"training throughput, 2 nodes (median pair ratio {pair_median(result['pairs']):.3f})")
    return [path]


if __name__ == "__main__":
    from bench.report import standalone

    standalone("throughput", nodes=2, run=run, plot=plot)
