"""MPI gradient data plane vs gloo DDP: step time on the same model, 2 ranks, measured in one run.

    python -m bench.mpi_vs_ddp [--quick] [--out bench/out/mpi_vs_ddp.json]

Model: the MLP (512-2048-2048-10; :func:`model` counts its parameters) of ``training.workloads.mlp``, per-rank batch 64,
random data, SGD. Every run uses training/train.py; a run's step time is the median of its per-epoch
median step times in ``metrics.jsonl`` (epoch 0 is warm-up and left out). Three kinds of run,
interleaved (DDP, MPI, floor, DDP, MPI, floor, ...) so that drift of the machine hits them alike:

* **gloo-ddp**: ``torchrun --standalone --nproc-per-node=2`` (DDP, gloo);
* **mpi4py**: ``mpirun -np 2`` (the MPI data plane: one in-place ``Allreduce`` per persistent flat bucket);
* **compute floor**: two single-process runs side by side, no gradient exchange at all -- what a step
  costs when both cores compute, so each data plane's cost is its step minus the floor.

Both data planes move their bytes the same way, TCP over the loopback interface (:data:`TRANSPORTS`; the
page says it on every row): gloo has no shared-memory transport, while Open MPI on one host would take its
shared-memory BTL unless told not to. Results recorded before that rule (issue 38) ran MPI with
``btl self,vader,tcp``, i.e. through shared memory; the page says so for them (:data:`RECORDED_BEFORE`).

Target (issue 2): MPI <= 0.7x DDP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.verdicts import Target, attach, describe, paired, shown

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "training" / "train.py")
PLANES = ("gloo-ddp", "mpi4py", "compute-floor")
FASTER = Target("<=", 0.7)  # MPI / DDP step time (issue 2)
TARGET = f"MPI / DDP step time {FASTER}"

# The same transport for both planes: TCP over lo.
# - gloo: torch/csrc/distributed/c10d/GlooDeviceFactory.cpp builds gloo's tcp, tcp_tls, uv or ibverbs device,
#   none of them shared memory (tcp is the one on Linux); GLOO_SOCKET_IFNAME picks its interface (pytorch.org/docs,
#   distributed.html, "Choosing the network interface to use").
# - Open MPI: docs.open-mpi.org/en/v5.0.x/networking/tcp.html gives "mpirun --mca pml ob1 --mca btl tcp,sm,self" to
#   use the IP network and warns that without the shared-memory BTL (sm in 5.0, vader in 4.1, the version here)
#   peers on the same host go through the TCP stack; the btl list must include self (the 5.0 release notes,
#   release-notes/run-time.html). btl_tcp_if_include (open-mpi.org/faq/?category=tcp, question 7) takes device names
#   or CIDR networks and is mutually exclusive with btl_tcp_if_exclude, whose default, 127.0.0.1/8,sppp, would keep
#   the tcp BTL off lo (`ompi_info --param btl tcp --level 9`, 4.1.4 here; with btl_base_verbose both ranks then
#   connect to 127.0.0.1).
LOOPBACK = "lo"
MPI_TCP = ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", LOOPBACK]
TRANSPORTS = {"gloo-ddp": [f"TCP over {LOOPBACK}", f"gloo, GLOO_SOCKET_IFNAME={LOOPBACK}"],
              "mpi4py": [f"TCP over {LOOPBACK}", f"pml ob1, btl self,tcp, btl_tcp_if_include {LOOPBACK}"],
              "compute-floor": ["none", "no gradient exchange"]}
RECORDED_BEFORE = {"gloo-ddp": ["TCP", "gloo, its interface from the hostname"],
                   "mpi4py": ["shared memory", "btl self,vader,tcp: vader between ranks on one host"],
                   "compute-floor": TRANSPORTS["compute-floor"]}


def model() -> dict:
    """The benchmark model's layer widths and parameter count, from the model the trainer builds."""
    from training.config import TrainConfig
    from training.workloads import mlp

    net = mlp(TrainConfig(workload="mlp", steps_per_epoch=1)).model
    widths = [net[0].in_features, *(layer.out_features for layer in net if hasattr(layer, "out_features"))]
    return {"model": f"MLP {'-'.join(map(str, widths))}", "params": sum(p.numel() for p in net.parameters())}


def mlp_params(widths: list[int]) -> int:
    """Parameters of a stack of Linear layers with bias (weights + biases) of these widths."""
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MULTINODE_", "OMPI_", "PMI"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               GLOO_SOCKET_IFNAME=LOOPBACK)
    return env


def _step_times(metrics_dir: Path) -> dict:
    rows = [json.loads(line) for line in (metrics_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "epoch" in r][1:] or [r for r in rows if "epoch" in r]
    return {"step_ms": 1000 * statistics.median(r["step_time_s"] for r in epochs),
            "comm_ms": 1000 * statistics.median(r["comm_time_s"] for r in epochs),
            "samples_per_s": statistics.median(r["samples_per_s"] for r in epochs)}


def _run(name: str, argvs: list[list[str]], args: list[str], out: Path) -> dict:
    """Start every argv at once (each with its own metrics dir), wait for all; the first one's step times."""
    procs = []
    for i, argv in enumerate(argvs):
        procs.append((out / str(i), subprocess.Popen([*argv, *args, "--metrics-dir", str(out / str(i))], env=_env(),
                                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    results = []
    for metrics, proc in procs:
        text = proc.communicate(timeout=900)[0]
        if proc.returncode != 0 or not (metrics / "metrics.jsonl").exists():
            raise RuntimeError(f"{name} run failed ({proc.returncode}):\n{text[-3000:]}")
        results.append(_step_times(metrics))
    return results[0]


def launchers() -> dict[str, list[list[str]]]:
    """Each plane's processes, started together, one argv each (all in the environment of :func:`_env`)."""
    alone = [sys.executable, TRAIN]
    return {
        "gloo-ddp": [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", TRAIN]],
        "mpi4py": [["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS", *MPI_TCP,
                    sys.executable, TRAIN]],
        "compute-floor": [alone, alone],
    }


def run(quick: bool = False) -> dict:
    epochs, steps, repeats = ("2", "10", 1) if quick else ("4", "40", 3)
    args = ["--workload", "mlp", "--batch-size", "64", "--steps-per-epoch", steps, epochs, "1000"]
    runs: dict[str, list[dict]] = {name: [] for name in PLANES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for name, argvs in launchers().items():
                runs[name].append(_run(name, argvs, args, Path(tmp) / f"{name}-{r}"))
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    pairs = [m["step_ms"] / d["step_ms"] for m, d in zip(runs["mpi4py"], runs["gloo-ddp"])]
    floor = med["compute-floor"]["step_ms"]
    result = {**model(), "ranks": 2, "batch_per_rank": 64, "transports": TRANSPORTS,
              "epochs": int(epochs), "steps_per_epoch": int(steps), "repeats": repeats, "runs": runs, **med,
              "pair_ratios": pairs, "mpi_over_ddp_step_ratio": statistics.median(pairs),
              "overhead_over_floor_ms": {n: med[n]["step_ms"] - floor for n in ("gloo-ddp", "mpi4py")}}
    return attach(result, judge(result), TARGET)


def transports(result: dict) -> dict[str, list[str]]:
    """How each plane moved its bytes: as recorded, or :data:`RECORDED_BEFORE` for a result that predates it."""
    return result.get("transports", RECORDED_BEFORE)


def judge(result: dict) -> list[dict]:
    """The median of the interleaved pairs, and every pair on its own; the claim names both transports, and a
    result whose planes moved bytes differently has every pair flagged, not counted (it compares transports)."""
    pairs = [(f"pair {i + 1}", p) for i, p in enumerate(result["pair_ratios"])]
    mpi, gloo = (transports(result)[name][0] for name in ("mpi4py", "gloo-ddp"))
    claim = f"MPI data plane ({mpi}) / gloo DDP ({gloo}) step time (median of pairs)"
    if mpi == gloo:
        return [paired(claim, pairs, FASTER)]
    why = f"MPI over {mpi}, DDP over {gloo}: not the same transport"
    return [paired(claim, [], FASTER, flagged=[(label, p, why) for label, p in pairs])]


def model_text(result: dict) -> str:
    """'MLP 512-2048-2048-10 (5,267,466 parameters)'; the count from the widths where a result lacks it."""
    name = result["model"].split(" (")[0]
    params = result.get("params") or mlp_params([int(w) for w in name.split()[1].split("-")])
    return f"{name} ({params:,} parameters)"


def table(result: dict) -> str:
    from bench.report import md_table

    rows = []
    for name in PLANES:
        r = result[name]
        over = result["overhead_over_floor_ms"].get(name)
        way, detail = transports(result)[name]
        rows.append([name, f"{way} ({detail})", f"{r['step_ms']:.1f}", "-" if over is None else f"{over:+.1f}",
                     "-" if name == "compute-floor" else f"{r['comm_ms']:.1f}", f"{r['samples_per_s']:.0f}"])
    pairs = ", ".join(shown(p, FASTER) for p in result["pair_ratios"])
    return "\n".join([
        md_table(["data plane", "transport", "step (ms, median)", "over the compute floor (ms)", "comm (ms/step)",
                  "samples/s (per run)"], rows),
        "",
        f"MPI / DDP step-time ratio: **{shown(result['mpi_over_ddp_step_ratio'], FASTER)}** (median of "
        f"{len(result['pair_ratios'])} pair(s): {pairs}; target {FASTER}). The compute floor alone is "
        f"{result['compute-floor']['step_ms'] / result['gloo-ddp']['step_ms']:.2f} of the DDP step.",
        "",
        "Verdict (computed by `bench.mpi_vs_ddp.judge`):",
        "",
        *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))),
    ])


def section(result: dict) -> str:
    return "\n".join([
        "## MPI gradient data plane vs gloo DDP",
        "",
        f"`python -m bench.mpi_vs_ddp`: {model_text(result)}, {result['ranks']} ranks on one machine, per-rank batch "
        f"{result['batch_per_rank']}, {result['epochs']} epochs x {result['steps_per_epoch']} steps (epoch 0 left out), "
        f"SGD (fused CPU kernel), OMP_NUM_THREADS=1, {result['repeats']} interleaved repeat(s) of DDP, MPI and the "
        "compute floor (two single-process runs side by side, no gradient exchange). Step time = median of "
        "per-epoch medians from metrics.jsonl; comm = time inside the gradient all-reduce per step (DDP overlaps "
        "it with backward, so it is not additive there).",
        "",
        table(result),
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--out", type=Path, help="write the result here (.md: a page with the table; else JSON)")
    args = parser.parse_args()
    result = run(args.quick)
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# Benchmarks\n\n{section(result)}" if args.out.suffix == ".md"
                            else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
