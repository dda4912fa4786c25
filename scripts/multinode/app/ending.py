"""How an attempt ended, as the user reads it: its :class:`~multinode.core.outcome.Outcome` made a
:class:`~multinode.diagnose.summary.RunSummary` (:func:`summarize`; a failure's root cause by :func:`diagnose`),
saved as ``summary.json`` (:func:`save`, the only writer) and printed at the end of the run (:func:`report`).

The root cause of a failed, lost or stalled job: a stopped or uninterruptible rank; else the first node that failed
on its own (its log does not read like a reaction to another's failure); else a rank stuck outside any collective
(the live ranks' stacks, captured before the stop); else the first failure. A log that reads like a broken
connection gets the link check's second look, while the nodes still answer (the nodes the job lost left out).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TextIO

from multinode.app.attempt import Attempt
from multinode.checks.links import connection_error
from multinode.core.errors import NodeError
from multinode.core.outcome import Outcome
from multinode.core.rundir import RunDir
from multinode.diagnose.goodput import goodput_line
from multinode.diagnose.ledger import JobMarks, parse_marks
from multinode.diagnose.rank import log_lines, pick_root_cause, root_cause
from multinode.diagnose.report import save as save_stacks
from multinode.diagnose.slowranks import windows as step_windows
from multinode.diagnose.summary import (Phases, RunSummary, describe, parse_preempted, parse_result, parse_resumed,
                                        result_from_metrics)


def summarize(attempt: Attempt, outcome: Outcome, phases: Phases, started: float) -> RunSummary:
    """The outcome as the user reads it: exit codes, wall time (since ``started``, monotonic), result; a failure's
    root cause. Nothing is written."""
    ctx = attempt.ctx
    how: dict = {"result": None, "metrics": None}
    if outcome.is_failure:
        how.update(diagnose(attempt, outcome))
    elif outcome.kind == "interrupted":
        how["error"] = outcome.failure.message
    else:
        lines = list(outcome.lines) or _log(ctx.run_dir, ctx.inv.head.name)
        how["metrics"] = attempt.backend.reach.metrics(ctx)
        how["result"] = parse_result(lines) or result_from_metrics(how["metrics"])
        how["preempted"] = _preempted(outcome, lines)
    summary = RunSummary(run_id=ctx.spec.run_id, mode=ctx.spec.mode, nodes=ctx.spec.nodes,
                         world_size=attempt.plan.world_size, exit_codes=outcome.exit_codes,
                         wall_seconds=round(time.monotonic() - started, 2), log_dir=str(ctx.run_dir),
                         phases=phases.seconds, links=attempt.links, outcome=outcome.kind,
                         slow_ranks=attempt.slow.record() if attempt.slow else None,
                         exit_code=outcome.exit_code, **how)
    phases.mark("summary")
    return summary


def diagnose(attempt: Attempt, outcome: Outcome) -> dict:
    """The root cause of a failed, lost or stalled job (module doc): the summary's fields that say so."""
    ctx, captured, run_dir = attempt.ctx, attempt.captured, attempt.ctx.run_dir
    failures = list(outcome.failures) or [outcome.failure]
    first = pick_root_cause(failures, outcome.failure)
    rank = attempt.backend.failed_rank(ctx, attempt.plan, first.node, log_lines(first, run_dir))
    # A stall is the watchdog's stop, no node's failure: the culprit comes from the stacks alone.
    culprit = root_cause(captured.dumps, [] if outcome.kind == "stalled" else failures) if captured else None
    if culprit is not None:
        log_path = run_dir / f"{culprit.node}.log"
        first = NodeError(culprit.node, "job", None, f"hung: {culprit.describe()}",
                          tail=_log(run_dir, culprit.node)[-10:], log_path=str(log_path))
        rank = culprit.rank
    stacks = str(save_stacks(run_dir / "stacks", captured.per_node, captured.errors)) if captured else None
    alive = [n.name for n in ctx.inv.nodes if n.name not in outcome.lost]  # a lost node's links cannot answer
    if len(alive) > 1 and any(connection_error(_log(run_dir, n.name)) for n in ctx.inv.nodes):
        among = replace(ctx, inv=ctx.inv.only(alive)) if len(alive) < len(ctx.inv.nodes) else ctx
        attempt.links = attempt.backend.reach.link_check(among, "report", after_failure=True)
    where = first.node if rank is None else f"{first.node} (rank {rank})"
    return {"failed_node": first.node, "failed_rank": rank, "cause": culprit.describe() if culprit else None,
            "stacks": stacks, "error": f"job failed first on {where}: {first.message}", "failure": first.describe()}


def resumed_report(attempt: Attempt, outcome: Outcome) -> dict | None:
    """Our trainer's RESUMED report (the snapshot the attempt continued from): in the job's lines, or in whichever
    node log holds rank 0's lines (the head's, unless it was lost)."""
    for lines in [list(outcome.lines)] + [_log(attempt.ctx.run_dir, n.name) for n in attempt.ctx.inv.nodes]:
        report = parse_resumed(lines) if lines else None
        if report is not None:
            return report
    return None


def job_marks(attempt: Attempt, outcome: Outcome, reached_step: int | None) -> JobMarks:
    """The attempt's job as the ledger reads it: rank 0's marks (in the job's lines, or in whichever node log holds
    them), the step it resumed from, ``reached_step`` (the heartbeat's, for an attempt recovered from) and every
    rank's step-time windows (its node's log: the ledger's slow steps)."""
    nodes = attempt.ctx.inv.nodes
    marks: list[dict] = []
    for lines in [list(outcome.lines)] + [_log(attempt.ctx.run_dir, n.name) for n in nodes]:
        marks = parse_marks(lines) if lines else []
        if marks:
            break
    resumed = (resumed_report(attempt, outcome) or {}).get("step")
    windows = tuple(w for n in nodes for w in step_windows(_log(attempt.ctx.run_dir, n.name), n.name))
    return JobMarks(attempt.number, tuple(n.name for n in nodes), tuple(marks),
                    resumed if isinstance(resumed, int) else None, reached_step, windows)


def save(run_dir: Path, summary: RunSummary) -> None:
    """``summary.json`` (and a recovering run's ``recovery.json``): written here, nowhere else."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files = RunDir(run_dir)
    files.summary.write_text(json.dumps(asdict(summary), indent=2))
    if summary.recovery:
        files.recovery.write_text(json.dumps(summary.recovery, indent=2))


def report(summary: RunSummary, out: TextIO, err: TextIO, timeline: list[str]) -> None:
    """The run's last words: the summary (a failure's, with what failed first and its last lines, to ``err``),
    then the recovery's ``timeline`` lines, then the ledger's goodput line."""
    if summary.failed_node:
        print(f"multinode: {summary.error}", file=err)
        print(summary.failure, file=err)
        print(describe(summary), file=err)
    elif summary.outcome == "interrupted":
        print(f"multinode: {summary.error}", file=err)
    else:
        print(describe(summary), file=out)
    for line in timeline:
        print(line, file=out)
    if summary.ledger:
        print(goodput_line(summary.ledger), file=out)


def _preempted(outcome: Outcome, lines: list[str]) -> dict | None:
    """Rank 0's PREEMPTED report of a preempted job (training/preempt.py); ``stopped_by`` when the orchestrator's
    own stop signal was the notice."""
    if outcome.kind != "preempted":
        return None
    found = parse_preempted(lines) or {"notice": "a rank exited 75 (preempted) with no report"}
    return {**found, "stopped_by": outcome.stopped_by} if outcome.stopped_by else found


def _log(run_dir: Path, node: str) -> list[str]:
    """A node's log lines on the control machine (none if it has no log)."""
    path = run_dir / f"{node}.log"
    return path.read_text(errors="replace").splitlines() if path.exists() else []
