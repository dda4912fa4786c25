"""``python -m bench.gpu --out OUT [--device cuda|cpu] [--quick]``: every item of the GPU check (bench/gpu/__init__.py),
``OUT/gpu.json`` (rewritten after each stage, so a check cut short keeps what ran) and ``OUT/gpu.log`` (progress and
every process's whole output). Exit 0 when every verdict passed, 1 otherwise.

Stages, most important first, within ``--budget`` seconds (a stage that would start past it is recorded as not run):
the machine; items 1-3, 2b, 4 and 6 side by side (``--jobs`` processes at a time; resumes after what they resume);
item 5's timings, one process at a time (nothing else runs then); item 5's all-reduce sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.gpu import machine, plan, runs, smoke, verdicts
from bench.gpu.regroup import LEAVE

REPO = Path(__file__).resolve().parents[2]
SIZES = ",".join(str(4096 * 4**k) for k in range(9))  # 4 KiB .. 256 MiB, as training/allreduce_perf.py's default


def _regroup(ctx: runs.Context, leave: str) -> dict:
    backend = "nccl" if ctx.device == "cuda" else "gloo"
    done = runs.child("regroup", ["--backend", backend, "--leave", leave], ctx, 150, name=f"regroup_{leave}")
    return {"exit": done.exit, "apis": plan.marker(done.output, "APIS"), "steps": plan.markers(done.output, "STEP"),
            "result": plan.marker(done.output, "REGROUP"), "tail": runs.tail(done.output) if done.exit else []}


# the uninterrupted run; the trainer's settings, leaving by destroy_process_group first, then by _abort_process_group
# first; the baseline: torch's own dump wait (leaving as runs before this one did, by _abort_process_group first)
TIMEOUT_RUNS = {"full": [], "fault": ["--fault", "--leave", "destroy"], "fault_abort": ["--fault", "--leave", "abort"],
                "torch_dump_wait": ["--fault", "--leave", "abort", "--torch-dump-wait"]}


def _timeout(ctx: runs.Context, kind: str) -> dict:
    backend = "nccl" if ctx.device == "cuda" else "gloo"
    work = ctx.work / f"timeout_{kind}"
    work.mkdir(parents=True, exist_ok=True)
    done = runs.child("timeout", ["--backend", backend, "--work", str(work), *TIMEOUT_RUNS[kind]], ctx, 180,
                      name=f"timeout_{kind}")
    final = work / "final.pt"
    return {"exit": done.exit, "record": plan.marker(done.output, "TIMEOUT"), "steps": plan.markers(done.output, "STEP"),
            "resumed": plan.marker(done.output, "RESUMED"), "final_model": str(final) if final.is_file() else None,
            "tail": runs.tail(done.output)}


def _timing(ctx: runs.Context, pairs: int) -> dict:
    records = {run.name: runs.run_train(run, ctx, 240) for run in plan.timing_runs(ctx.device, pairs)}
    measured = []
    for i in range(1, pairs + 1):
        cpu, gpu = (records[f"mlp_{kind}_{i}"].get("last_epoch") or {} for kind in ("cpu", "gpu"))
        measured.append({"cpu": {k: cpu.get(k) for k in ("step_time_s", "samples_per_s")},
                         "gpu": {k: gpu.get(k) for k in ("step_time_s", "samples_per_s")}})
    step = plan.median_ratio([(m["cpu"]["step_time_s"], m["gpu"]["step_time_s"]) for m in measured])
    rate = plan.median_ratio([(m["gpu"]["samples_per_s"], m["cpu"]["samples_per_s"]) for m in measured])
    return {"args": list(plan.MLP_ARGS), "pairs": measured, "cpu_over_gpu_step_time": step,
            "gpu_over_cpu_samples_per_s": rate, "runs": {k: {"exit": v["exit"], "tail": v["tail"] if v["exit"] else []}
                                                        for k, v in records.items()}}


class Record:
    """The check's log (progress lines on stdout too; every process's whole output) and its JSON, rewritten whole
    after each stage."""

    def __init__(self, out: Path, data: dict):
        self.start, self.out, self.data = time.monotonic(), out, data
        out.mkdir(parents=True, exist_ok=True)
        self.logfile = open(out / "gpu.log", "a", buffering=1, encoding="utf-8")

    def log(self, line: str) -> None:
        stamped = f"[{time.monotonic() - self.start:6.1f} s] {line}"
        print(stamped, flush=True)
        self.logfile.write(stamped + "\n")

    def transcript(self, name: str, output: str) -> None:
        self.logfile.write(f"---- {name} ----\n{output.rstrip()}\n---- end of {name} ----\n")

    def save(self) -> None:
        self.data["seconds"] = round(time.monotonic() - self.start, 1)
        tmp = self.out / "gpu.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.out / "gpu.json")


def correctness(ctx: runs.Context, data: dict, quick: bool, jobs: int) -> None:
    """Items 1-4 and 6, side by side; their records and the weights they compare, into ``data``."""
    planned = plan.correctness_runs(ctx.device, quick)
    # the longest first (the baseline of item 6 sleeps a minute in NCCL's watchdog), so the others overlap it
    tasks = {f"timeout_{kind}": (lambda kind=kind: _timeout(ctx, kind)) for kind in reversed(TIMEOUT_RUNS)}
    tasks.update({run.name: (lambda r=run: runs.run_train(r, ctx, 240, ctx.threads)) for run in planned})
    tasks.update({f"regroup_{leave}": (lambda leave=leave: _regroup(ctx, leave)) for leave in LEAVE})
    # the rehearsal's node claims one GPU, so the smoke test runs there too (and says the CPU build has none)
    tasks["smoke"] = lambda: smoke.run(ctx, data["machine"].get("smi_gpus", 1), 120)
    ctx.log(f"correctness stage: {len(tasks)} tasks, {jobs} at a time")
    done = runs.waves(tasks, {r.name: plan.waits_for(r) for r in planned if plan.waits_for(r)}, jobs)
    data["train"] = {run.name: done[run.name] for run in planned}
    data["regroup"] = {leave: done[f"regroup_{leave}"] for leave in LEAVE}
    data["timeout"] = {kind: done[f"timeout_{kind}"] for kind in TIMEOUT_RUNS}
    data["smoke"] = done["smoke"]
    t, full = data["train"], data["timeout"]["full"].get("final_model")
    data["compare"] = {
        "resume": runs.compare_weights(t["resume_full"].get("final_model"), t["resume_resumed"].get("final_model")),
        "mpi_vs_ddp": runs.compare_weights(t["gloo_ddp_2"].get("final_model"), t["mpi_plane_2"].get("final_model")),
        "timeout_resume": runs.compare_weights(full, data["timeout"]["fault"].get("final_model")),
        **{f"timeout_resume_{kind}": runs.compare_weights(full, data["timeout"][kind].get("final_model"))
           for kind in ("fault_abort", "torch_dump_wait")},
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where gpu.json and gpu.log go")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer epochs and one timing pair (a rehearsal)")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new one under the system's temp)")
    parser.add_argument("--mpi-prefix", help="an MPICH installed from its wheel (pip install --prefix), used when "
                        "there is no mpirun on PATH")
    parser.add_argument("--jobs", type=int, default=4, help="processes at a time in the correctness stage")
    parser.add_argument("--pairs", type=int, default=3, help="CPU/GPU pairs of mlp runs")
    parser.add_argument("--budget", type=float, default=420, help="seconds the whole check may take")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench.gpu: --device cuda but torch sees no GPU (torch.cuda.is_available() is False); "
                  "use --device cpu for the rehearsal", file=sys.stderr)
            return 2
    record = Record(args.out, {"command": "python -m bench.gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
                               "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                               "mode": args.device, "quick": args.quick})
    data = record.data
    data["machine"] = machine.describe(args.device, args.mpi_prefix)
    record.log(f"machine: {json.dumps(data['machine'])}")
    record.save()
    ctx = runs.Context(REPO, args.work or Path(tempfile.mkdtemp(prefix="gpucheck-")), args.device,
                       data["machine"]["mpi"], record.log, record.transcript, record.start + args.budget)
    correctness(ctx, data, args.quick, args.jobs)
    record.save()
    for name, stage in (("timing", lambda: _timing(ctx, 1 if args.quick else args.pairs)),
                        ("allreduce", lambda: runs.allreduce(ctx, 120, SIZES, 256 if args.quick else 1024))):
        if time.monotonic() > ctx.deadline - 20:
            data[name] = {"not_run": f"the check's budget of {args.budget:g} s was spent"}
        else:
            record.log(f"{name} stage")
            data[name] = stage()
        record.save()
    data["verdicts"] = verdicts.rows(data)
    data["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record.save()
    for row in data["verdicts"]:
        said = {True: "PASS", False: "FAIL", None: "N/A ", "record": "REC "}[row["ok"]]
        record.log(f"{said} item {row['item']}: {row['check']}: {row['figure']}")
    record.logfile.close()
    return 0 if all(row["ok"] is not False for row in data["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
