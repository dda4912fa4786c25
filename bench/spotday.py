"""``python -m bench.spotday [--quick] [--out-dir docs] [--reports DIR]``: A spot day, replayed -- how much of what
was paid for trained, ours against what users run today, under one interruption pattern.

The trace (``bench/traces/spotday-9.json``, made by ``python -m bench.spotday_trace``: every figure cited there,
the compression factor in the file) is replayed on 4 local nodes for each method in turn, the same events at the
same seconds of each method's run (``bench.spotday_replay``): ours (``RECOVER`` with its defaults), a
whole-cluster restart from the last periodic snapshot on every interruption (SkyPilot's managed-job strategy),
torchrun ``--max-restarts`` resuming from the last periodic snapshot, and the job uninterrupted
(``bench.spotday_methods`` says what each does; every ``train`` with ``LINKCHECK=warn``, and why). The job: our
digits trainer, each step paced by its work (``--min-sample-seconds``: a rank's share of a step takes at least that
per sample, so a step on fewer nodes at the same global batch takes longer, as a compute-bound model's would), its
periodic snapshot the baselines' checkpoint.

The figures are read outside the ledger wherever they can be (``bench.spotday_figures``): useful samples from the
trainer's sample log, node-seconds from every instance's life, and the ledger's goodput beside the sample log's.
Targets (issue 46), judged by ``bench.verdicts``' one rule: ours at least 0.9 of the uninterrupted run's useful
samples per node-second paid; ours finishing the same work in at most 0.6 of the whole-cluster restart's wall
time; 0 samples missing for ours; the ledger's goodput within 2 points of the sample log's for every method.
The full replay is one run of each method (at least 15 minutes each): its verdicts are one run's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.spotday_figures import against, figures, rate, timelines
from bench.spotday_methods import METHODS, Job
from bench.spotday_trace import QUICK, TRACES, Trace, load
from bench.verdicts import Target, attach, describe, paired, shown

TRACE = TRACES / "spotday-9.json"
# 360 epochs of 10 steps of 256 ms (32 samples x 8 ms on each of 4 ranks: a step computes in about 20 ms here, so
# the pace holds on a busy machine) and their ends: over 15 minutes (340 epochs took 879 s uninterrupted, start to
# end, 2026-11-27); a periodic snapshot about every 30 s.
FULL = Job(epochs=360, save_every=12, sample_seconds=0.008)
QUICK_JOB = Job(epochs=30, save_every=10, sample_seconds=0.008)
PER_NODE_SECOND, WALL, MISSING, GAP = Target(">=", 0.9), Target("<=", 0.6), Target("<=", 0), Target("<=", 0.02)
TARGET = (f"ours / uninterrupted useful samples per node-second paid {PER_NODE_SECOND}; ours / whole-cluster "
          f"restart wall time {WALL}; samples missing for ours {MISSING}; how far the ledger's goodput is from the "
          f"sample log's {GAP} for every method")
LABELS = {"uninterrupted": "uninterrupted", "ours": "ours (RECOVER)", "torchrun": "torchrun --max-restarts",
          "restart": "whole-cluster restart"}


def run(cluster=None, quick: bool = False, trace: Trace | None = None, reports: Path | None = None) -> dict:
    """Every method once on the trace (module doc); the result the page and the verdicts read."""
    trace = trace or (QUICK if quick else load(TRACE))
    job = QUICK_JOB if quick else FULL
    runs = {name: method(job, trace, reports) for name, method in METHODS.items()}
    methods = {name: figures(r, trace.events[0].at) for name, r in runs.items()}
    reference = rate(runs["uninterrupted"].samples)
    against(methods, reference)
    result = {"trace": {"file": None if trace.quick else str(TRACE.relative_to(TRACES.parents[1])),
                        **trace.to_json()},
              "job": {"args": job.args(), "nodes": 4}, "reference_rate": round(reference, 2), "methods": methods}
    return attach(result, judge(result), TARGET)


def judge(result: dict) -> list[dict]:
    m = result["methods"]
    one = "runs"
    verdicts = [
        paired("ours: useful samples per node-second paid / the uninterrupted run's",
               [("run", m["ours"]["useful_per_node_s_vs_uninterrupted"])], PER_NODE_SECOND, one),
        paired("ours: wall time for the same work / the whole-cluster restart's",
               [("run", m["ours"]["wall_s"] / m["restart"]["wall_s"])], WALL, one),
        paired("ours: samples missing", [("run", float(m["ours"]["samples_missing"]))], MISSING, one)]
    verdicts += [paired(f"{LABELS[name]}: how far the ledger's goodput is from the sample log's (0.02: 2 points)",
                        [("run", f["goodput_gap"])], GAP, one) for name, f in m.items()]
    return verdicts


def wall_floor(result: dict) -> float:
    """The lowest the wall target's ratio can be on this trace: the uninterrupted run's wall over the whole-cluster
    restart's. A method that trains no faster than the job untouched (the trace's slowdowns and missing nodes only
    add to it) cannot finish in less than the uninterrupted run's wall."""
    m = result["methods"]
    return round(m["uninterrupted"]["wall_s"] / m["restart"]["wall_s"], 4)


def _row(name: str, f: dict) -> list[str]:
    return [LABELS[name], f"{f['wall_s']:.0f}", f"{f['node_seconds']:.0f}", str(f["useful_samples"]),
            f"{f['useful_per_s_vs_uninterrupted']:.3f}", f"{f['useful_per_node_s_vs_uninterrupted']:.3f}",
            str(f["steps_trained_twice"]), str(f["samples_missing"]), f"{f['ledger_goodput']:.3f}",
            f"{f['samples_goodput']:.3f}", shown(f["goodput_gap"], GAP),
            ", ".join(f"{k} {v}" for k, v in f["recoveries"].items()) or "none"]


def section(result: dict) -> str:
    from bench.report import md_table

    t = result["trace"]
    floor = wall_floor(result)
    events = "; ".join(f"+{e['at']:g} s {e['kind']}" + (f" node-{e['node']}" if "node" in e else "")
                       for e in t["events"])
    doc = __doc__.split("\n\n")
    return "\n".join([
        "## A spot day, replayed: goodput against what users run today",
        "", doc[0].replace("``", "`").split(": ", 1)[1].replace("\n", " "),
        "", " ".join(doc[1].replace("``", "`").split()),
        "", f"Trace: `{t['file'] or 'the quick mode trace'}`, seed {t['seed']}, {len(t['events'])} events "
            f"({', '.join(f'{k} {v}' for k, v in t['kinds'].items())}), the real time between events compressed "
            f"{t['factor']:g} times (notice leads, launch times, shortages and slowdowns are not): {events}.",
        "", f"Job: `{result['job']['args']}` on {result['job']['nodes']} nodes; the uninterrupted run's useful "
            f"samples per second of training: {result['reference_rate']:g}.",
        "", md_table(["method", "wall (s)", "node-s paid", "useful samples", "samples/s vs uninterrupted",
                      "samples per node-s vs uninterrupted", "steps trained twice", "samples missing",
                      "goodput (ledger)", "goodput (sample log)", "gap", "recoveries"],
                     [_row(name, f) for name, f in result["methods"].items()]),
        "", "The machine is shared and its load drifts between the methods' runs, which the sample log's goodput "
            "(the uninterrupted run's rate) does not see and each ledger (its own healthy step) does: each method's "
            "own rate before the trace's first event, and the 1-minute load average as it began and ended: "
            + "; ".join(f"{LABELS[name]} {f['rate_before_first_event']} samples/s, load {f['load_avg_1m'][0]:g} -> "
                        f"{f['load_avg_1m'][-1]:g}" for name, f in result["methods"].items()) + ".",
        "", "Sources of the trace's figures:", "", *(f"- {k}: {v}" for k, v in t["sources"].items()),
        "", " ".join(doc[2].split()),
        "", "Verdicts (computed by `bench.spotday.judge`):", "",
        *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result))),
        "", f"The wall target's floor on this trace (`bench.spotday.wall_floor`): the uninterrupted run's wall over "
            f"the whole-cluster restart's, {floor:.3f}; no method finishes the same work faster than the job "
            f"untouched, so the target ({WALL}) is " + ("within reach" if WALL.met(floor) else "out of reach")
            + " on this trace.",
        "", "![the methods' timelines](spotday.png)", ""])


def plot(result: dict, out_dir: Path) -> list[Path]:
    return [timelines(result, out_dir / "spotday.png")]


def main(argv: list[str] | None = None) -> int:
    from bench.provenance import began
    from bench.report import DOCS, publish

    parser = argparse.ArgumentParser(prog="python -m bench.spotday", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two events, a few minutes: checks the replay runs")
    parser.add_argument("--out-dir", type=Path, default=DOCS, help="where benchmarks.json/.md and the picture go")
    parser.add_argument("--reports", type=Path, help="write every train's run report (report.html) here")
    args = parser.parse_args(argv)
    start = began(settle=not args.quick)
    publish("spotday", run(None, quick=args.quick, reports=args.reports), args.quick, args.out_dir, plot, start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
