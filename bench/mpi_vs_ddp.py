"""MPI gradient data plane vs gloo DDP: step time on the same model, 2 ranks, measured in one run.

    python -m bench.mpi_vs_ddp [--quick] [--out bench/out/mpi_vs_ddp.json]

Model: the 5.26 M-parameter MLP (512-2048-2048-10) of ``training.workloads.mlp``, per-rank batch 64,
random data, SGD. Both runs use training/train.py; the step time is the median of the per-epoch median
step times in ``metrics.jsonl`` (epoch 0 is warm-up and left out). Target (issue 2): MPI <= 0.7x DDP.
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

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "training" / "train.py")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MULTINODE_", "OMPI_", "PMI"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _step_times(metrics_dir: Path) -> dict:
    rows = [json.loads(line) for line in (metrics_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "epoch" in r][1:] or [r for r in rows if "epoch" in r]
    return {"step_ms": 1000 * statistics.median(r["step_time_s"] for r in epochs),
            "comm_ms": 1000 * statistics.median(r["comm_time_s"] for r in epochs),
            "samples_per_s": statistics.median(r["samples_per_s"] for r in epochs)}


def run(quick: bool = False) -> dict:
    epochs, steps = ("2", "10") if quick else ("4", "40")
    args = ["--workload", "mlp", "--batch-size", "64", "--steps-per-epoch", steps, epochs, "1000"]
    launchers = {
        "gloo-ddp": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", TRAIN],
        "mpi4py": ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
                   "--mca", "btl", "self,vader,tcp", sys.executable, TRAIN],
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in launchers.items():
            out = Path(tmp) / name
            res = subprocess.run([*argv, *args, "--metrics-dir", str(out)], env=_env(), capture_output=True, text=True,
                                 timeout=900)
            if res.returncode != 0 or not (out / "metrics.jsonl").exists():
                raise RuntimeError(f"{name} run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
            results[name] = _step_times(out)
    ratio = results["mpi4py"]["step_ms"] / results["gloo-ddp"]["step_ms"]
    return {"model": "MLP 512-2048-2048-10 (5.26 M params)", "ranks": 2, "batch_per_rank": 64,
            "epochs": int(epochs), "steps_per_epoch": int(steps), **{k: v for k, v in results.items()},
            "mpi_over_ddp_step_ratio": ratio, "target": "<= 0.7"}


def table(result: dict) -> str:
    lines = ["| data plane | step (ms, median) | comm (ms/step) | samples/s |", "|---|---:|---:|---:|"]
    for name in ("gloo-ddp", "mpi4py"):
        r = result[name]
        lines.append(f"| {name} | {r['step_ms']:.1f} | {r['comm_ms']:.1f} | {r['samples_per_s']:.0f} |")
    lines.append(f"\nMPI / DDP step-time ratio: **{result['mpi_over_ddp_step_ratio']:.2f}** (target {result['target']})")
    return "\n".join(lines)


def page(result: dict) -> str:
    from datetime import datetime, timezone

    return "\n".join([
        "# Benchmarks",
        "",
        "## MPI gradient data plane vs gloo DDP",
        "",
        f"Measured by `python -m bench.mpi_vs_ddp` on {datetime.now(timezone.utc):%Y-%m-%d}, this machine "
        f"({os.cpu_count()} cores, CPU only), both runs in the same invocation: {result['model']}, "
        f"{result['ranks']} ranks on one machine, per-rank batch {result['batch_per_rank']}, "
        f"{result['epochs']} epochs x {result['steps_per_epoch']} steps (epoch 0 left out as warm-up), "
        "OMP_NUM_THREADS=1, SGD with momentum. Step time = median of the per-epoch medians from metrics.jsonl; "
        "comm = time inside the gradient allreduce per step (DDP overlaps it with backward).",
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
        if args.out.suffix == ".md":
            args.out.write_text(page(result))
        else:
            args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
