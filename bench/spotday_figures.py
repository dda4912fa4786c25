"""The spot day's figures per method, read from what its replay left (:class:`bench.spotday_methods.MethodRun`) --
outside the ledger wherever they can be -- and the picture of the methods' timelines.

* From the trainer's sample log (every line of every head's ``samples.jsonl``, with the time it was seen):
  **useful samples** (each (epoch, sample id) once: a sample trained twice counts once), **steps trained twice**
  (an optimizer step number logged more than once: work done before an interruption and done again), **samples
  missing** (ids of an epoch never trained, against the epoch with the most);
* **node-seconds paid**: every instance from its launch to its end (:mod:`bench.spotday_watch`);
* **wall**: from the method's first ``train`` to the end of its last, the method's own downtime included;
* the **ledger's goodput**: its training seconds, every ``train`` of the method added up, less the steps a ``train``
  trained again that the one before had trained (each ledger knows only its own ``train``), over the wall;
* the **sample log's goodput**: useful samples over what the uninterrupted run trains in the same wall time at its
  own rate -- useful samples seen between its first and last sample line over that time (:func:`rate`). The one
  is computed from the job's marks and step times, the other from the samples the trainer logged and when they
  appeared: the ledger's first independent check.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

KEEP = ("goodput", "wall_seconds", "buckets", "spans", "recoveries", "steps_trained_twice", "job_restarts",
        "healthy_step_ms", "slow_steps_by_rank")


def sample_figures(lines: list[tuple[float, str]]) -> dict:
    """Useful samples, samples trained in all, steps trained twice and samples missing (module doc)."""
    steps: Counter = Counter()
    epochs: dict[int, set[int]] = {}
    trained = 0
    for _, line in lines:
        row = json.loads(line)
        steps[row["step"]] += 1
        epochs.setdefault(row["epoch"], set()).update(row["ids"])
        trained += len(row["ids"])
    every = max(epochs.values(), key=len) if epochs else set()
    return {"useful_samples": sum(len(ids) for ids in epochs.values()), "trained_samples": trained,
            "steps_trained_twice": sum(1 for n in steps.values() if n > 1),
            "samples_missing": sum(len(every - ids) for ids in epochs.values()), "epochs": len(epochs)}


def rate(lines: list[tuple[float, str]]) -> float:
    """Useful samples per second of a run's training: those of its lines after the first, over the time between its
    first and last line as seen."""
    if len(lines) < 2 or lines[-1][0] <= lines[0][0]:
        raise ValueError("a rate needs two sample lines seen at different times")
    return sum(len(json.loads(line)["ids"]) for _, line in lines[1:]) / (lines[-1][0] - lines[0][0])


def ledger_training(ledgers: list[dict]) -> tuple[float, float]:
    """(training seconds of every ``train``'s ledger added up, across trains as the ledger does across attempts;
    those trained again). A ``train`` resumed from the snapshot of step s trained again the steps after s that any
    ``train`` before it had trained (less, never more than its own training: a relaunch that found no snapshot starts
    at step 1 after a ``train`` that trained none), or, where the highest step trained so far came before s, the one
    that trained last trained the steps up to s after its last mark, in what its ledger took for teardown (more).
    Each at the time per step of the last ``train`` that trained more than one step."""
    total = again = 0.0
    high, per_step, last = None, 0.0, None
    for ledger in ledgers:
        total += ledger["buckets"]["training"]
        done = [a for a in ledger["attempts"] if "steps" in a]
        resumed = done[0]["steps"][0] - 1 if done else None
        if high is not None and resumed is not None:
            twice = min(ledger["buckets"]["training"], max(0, high - resumed) * per_step)
            kept = min(last["buckets"]["teardown"], max(0, resumed - high) * per_step)
            total += kept - twice
            again += twice
        if done:
            high = max(high or 0, max(a["steps"][1] for a in done))
            last = ledger
            timed = [a for a in done if a["steps"][1] > a["steps"][0]]
            if timed:
                a = timed[-1]
                per_step = (a["last_step"] - a["first_step"]) / (a["steps"][1] - a["steps"][0])
    return total, again


def recoveries(run) -> dict[str, int]:
    """What the method did about the events, by kind."""
    kinds: Counter = Counter()
    for train in run.invocations:
        events = [e["event"] for e in (train["recovery"] or {}).get("events", [])]
        kinds["node replaced"] += events.count("node ready")
        kinds["went on without a node"] += events.count("going on without it")
        kinds["grew back"] += events.count("node back")
        kinds["started again after a collective failed"] += events.count("collective failed")
        ledger = (train["summary"] or {}).get("ledger") or {}
        kinds["worker group restarted (torchrun)"] += len(ledger.get("job_restarts") or ())
        kinds["coordinated checkpoints"] += sum(1 for a in ledger.get("attempts", []) for c in a["checkpoints"]
                                                if c[2] != "periodic")
    for gap in run.gaps:
        kinds[gap["what"]] += 1
    return {kind: n for kind, n in kinds.items() if n}


def rate_before(lines: list[tuple[float, str]], t0: float, first_event: float | None) -> float | None:
    """A run's own rate (as :func:`rate`) over its lines seen before the trace's first event (None: too few): the
    machine's load drifts between runs, and this says how far."""
    early = [pair for pair in lines if first_event is None or pair[0] - t0 < first_event]
    try:
        return round(rate(early), 2)
    except ValueError:
        return None


def figures(run, first_event: float | None = None) -> dict:
    """One method's figures (module doc), its trains' ledgers (trimmed) and its events; the ratios against the
    uninterrupted run are :func:`against`'s."""
    wall = run.end - run.t0
    ledgers = [t["summary"]["ledger"] for t in run.invocations if (t["summary"] or {}).get("ledger")]
    training, again = ledger_training(ledgers)
    return {"wall_s": round(wall, 1), "node_seconds": round(run.paid, 1), **sample_figures(run.samples),
            "ledger_goodput": round(training / wall, 4), "ledger_trained_again_s": round(again, 1),
            "recoveries": recoveries(run), "events": run.applied, "load_avg_1m": run.load,
            "rate_before_first_event": rate_before(run.samples, run.t0, first_event),
            "trains": [{"from_s": round(t["from"] - run.t0, 1), "to_s": round(t["to"] - run.t0, 1), "exit": t["exit"],
                        "ledger": _trimmed((t["summary"] or {}).get("ledger")),
                        **({"error": (t["summary"] or {}).get("error")} if t["exit"] else {})}
                       for t in run.invocations],
            "gaps": [{"from_s": round(g["from"] - run.t0, 1), "to_s": round(g["to"] - run.t0, 1), "what": g["what"]}
                     for g in run.gaps], "reports": run.reports}


def _trimmed(ledger: dict | None) -> dict | None:
    """The ledger as the page and the picture need it (no per-window compute series: the run reports have them)."""
    if ledger is None:
        return None
    attempts = [{k: v for k, v in a.items() if k != "compute"} for a in ledger.get("attempts", [])]
    return {**{k: ledger[k] for k in KEEP if k in ledger}, "attempts": attempts}


def against(methods: dict[str, dict], reference_rate: float) -> None:
    """Each method's ratios against the uninterrupted run's, and the sample log's goodput (module doc)."""
    base = methods["uninterrupted"]
    base_per_s = base["useful_samples"] / base["wall_s"]
    base_per_node_s = base["useful_samples"] / base["node_seconds"]
    for figures_ in methods.values():
        per_s = figures_["useful_samples"] / figures_["wall_s"]
        per_node_s = figures_["useful_samples"] / figures_["node_seconds"]
        figures_.update(useful_per_s=round(per_s, 2), useful_per_s_vs_uninterrupted=round(per_s / base_per_s, 4),
                        useful_per_node_s=round(per_node_s, 3),
                        useful_per_node_s_vs_uninterrupted=round(per_node_s / base_per_node_s, 4),
                        samples_goodput=round(figures_["useful_samples"] / (reference_rate * figures_["wall_s"]), 4))
        figures_["goodput_gap"] = round(abs(figures_["ledger_goodput"] - figures_["samples_goodput"]), 4)


def timelines(result: dict, path: Path) -> Path:
    """The methods' timelines one above the other, from their trains' ledgers: each phase and the job's training,
    start, checkpoints and restarts coloured as the ledger's buckets, the method's own downtime as recovery, the
    replayed events as marks."""
    from bench.report import figure
    from multinode.diagnose.report_plots import COLOURS, PHASE_COLOUR

    names = list(result["methods"])
    with figure(path, figsize=(11, 1.2 + 0.9 * len(names))) as (_, ax):
        for row, name in enumerate(names):
            method = result["methods"][name]
            for train in method["trains"]:
                _train_bars(ax, row, train, COLOURS, PHASE_COLOUR)
            for gap in method["gaps"]:
                ax.broken_barh([(gap["from_s"], gap["to_s"] - gap["from_s"])], (row - 0.3, 0.6),
                               color=COLOURS["recovery"])
            for event in method["events"]:
                _event_mark(ax, row, event, COLOURS)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the method's first train (green: training; red: recovery and downtime; "
                      "marks: the trace's events, X also a noticed node taken; thin bars: slowdowns, shortages)")
        handles = [ax.scatter([], [], marker=m, color="black", label=k) for k, m in MARKS.items()]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5, fontsize=8, frameon=False)
    return path


MARKS = {"notice": "v", "lost": "X", "rebalance": "^", "no_capacity": "s", "slow": "o"}


def _event_mark(ax, row: int, event: dict, colours: dict) -> None:
    """An event as applied (its kind's mark; a slowdown's or a shortage's length as a thin bar under the row) and a
    noticed instance taken (the loss's mark); other effects are not drawn."""
    effect = event.get("effect")
    if effect not in (None, "taken"):
        return
    marker = MARKS["lost"] if effect == "taken" else MARKS.get(event["kind"], "*")
    ax.scatter([event["at"]], [row - 0.42], marker=marker, color="black", s=28, zorder=3)
    if effect is None and event["kind"] in ("slow", "no_capacity") and event.get("seconds"):
        colour = colours["slow steps"] if event["kind"] == "slow" else colours["wait"]
        ax.broken_barh([(event["at"], event["seconds"])], (row + 0.32, 0.08), color=colour)


def _train_bars(ax, row: int, train: dict, colours: dict, phase_colour: dict) -> None:
    ledger = train["ledger"]
    if ledger is None:
        ax.broken_barh([(train["from_s"], train["to_s"] - train["from_s"])], (row - 0.3, 0.6), color=colours["job"])
        return
    offset = train["to_s"] - ledger["wall_seconds"]  # the ledger's clock starts as the orchestrator does
    for span in ledger["spans"]:
        colour = colours[phase_colour.get(span["phase"], "other")]
        ax.broken_barh([(offset + span["from"], span["to"] - span["from"])], (row - 0.3, 0.6), color=colour)
    for attempt in ledger["attempts"]:
        if "first_step" not in attempt:
            continue
        start, first, last = attempt["job"][0], attempt["first_step"], attempt["last_step"]
        ax.broken_barh([(offset + start, first - start)], (row - 0.3, 0.6), color=colours["start"])
        ax.broken_barh([(offset + first, last - first)], (row - 0.3, 0.6), color=colours["training"])
        for at, until in attempt.get("restarts", ()):
            ax.broken_barh([(offset + at, until - at)], (row - 0.3, 0.6), color=colours["recovery"])
        for at, seconds, _ in attempt["checkpoints"]:
            ax.broken_barh([(offset + at, max(seconds, 0.5))], (row - 0.3, 0.6), color=colours["checkpoint"])
