"""How a run ended, as the user reads it: the ``RunSummary`` saved as ``summary.json`` and printed at the end,
the trainer's ``RESULT`` line (or its metrics) it quotes, and the rank-0 metrics fetched from the head node.
Shared by every way a job runs (SSH launchers, SLURM)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from multinode.core.config import LaunchSpec
from multinode.core.errors import NodeError
from multinode.core.inventory import Inventory
from multinode.trainer import channel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    mode: str
    nodes: int
    world_size: int
    exit_codes: dict[str, int | None]
    wall_seconds: float
    result: dict | None
    log_dir: str
    metrics: str | None
    failed_node: str | None = None
    failed_rank: int | None = None
    cause: str | None = None  # why that rank is the root cause (process state, top of its stack)
    stacks: str | None = None  # where the stacks of the ranks alive at failure time were saved
    phases: dict[str, float] | None = None  # wall seconds of each phase, in order (see Phases)
    preempted: dict | None = None  # rank 0's PREEMPTED report (training/checkpoint.py): notice, stop, copies
    links: dict | None = None  # the link check (multinode.checks.links.LinkReport): at pre-flight, or after a
    # failure that read like a broken connection (then ``links["after_failure"]`` is true)
    recovery: dict | None = None  # RECOVER=N: the recoveries' timeline (multinode.app.timeline.Timeline)
    slow_ranks: list[dict] | None = None  # ranks named slow while the job trained (multinode.diagnose.slowranks)
    outcome: str = "succeeded"  # how the job ended (multinode.core.outcome.OUTCOMES)
    exit_code: int = 0  # what the orchestrator exits with
    error: str | None = None  # a failed or interrupted job: what ended it, in one line
    failure: str | None = None  # a failed job: the failure that ended it, with its node's last lines and log
    ledger: dict | None = None  # where the wall time went, in buckets that add up to it (multinode.diagnose.ledger)


class Phases:
    """Where a run's time goes: ``mark(name)`` ends the phase ``name`` now (it began at the previous mark).
    Saved in summary.json (``phases``: seconds per name, every attempt's added) and measured across node counts by
    ``python -m bench.control_plane``; ``spans`` keeps each one apart, with its attempt (the ledger's input)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.spans: list[dict] = []  # {"phase", "attempt", "from", "to"}: seconds since ``began``
        self.attempt = 0  # the attempt the next marks belong to
        self.began = self._last = time.monotonic()
        self.began_unix = time.time()  # the same instant on the clock the job's marks use

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 3)
        self.spans.append({"phase": name, "attempt": self.attempt, "from": round(self._last - self.began, 3),
                           "to": round(now - self.began, 3)})
        self._last = now


def parse_result(lines: list[str]) -> dict | None:
    """The trainer's final ``RESULT`` record, if the script sent one (:mod:`training.channel`)."""
    return channel.last(lines, channel.RESULT)


def parse_preempted(lines: list[str]) -> dict | None:
    """Rank 0's ``PREEMPTED`` record (a coordinated checkpoint on a notice), if it sent one."""
    return channel.last(lines, channel.PREEMPTED)


def parse_resumed(lines: list[str]) -> dict | None:
    """Rank 0's ``RESUMED`` record: the snapshot a resumed run continued from (step, world sizes, batch)."""
    return channel.last(lines, channel.RESUMED)


def result_from_metrics(metrics: str | None) -> dict | None:
    """Our trainer's final ``test`` row of metrics.jsonl: the result when the RESULT line was not seen whole
    (mpirun forwards every rank's output through one pipe, and a long line can arrive cut)."""
    if not metrics or not Path(metrics).exists():
        return None
    for line in reversed(Path(metrics).read_text().splitlines()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("event") == "test":
            return {k: v for k, v in row.items() if k != "event"}
    return None


def fetch_metrics(runner, inv: Inventory, spec: LaunchSpec, run_dir: Path) -> str | None:
    """Copy rank 0's metrics.jsonl from the head node into the local run directory."""
    if spec.script is not None:
        return None
    remote = f"{inv.workdir_for(inv.head.name)}/runs/{spec.run_id}/metrics.jsonl"
    local = run_dir / "metrics.jsonl"
    try:
        runner.get_file(inv.head.name, remote, local)
    except (OSError, NodeError) as err:
        log.warning("no metrics fetched from %s: %s", remote, err)
        return None
    return str(local)


def describe(summary: RunSummary) -> str:
    """The summary block printed at the end of a run."""
    status = "FAILED" if summary.failed_node else "PREEMPTED" if summary.preempted else \
        "INTERRUPTED" if summary.outcome == "interrupted" else "ok"
    lines = [f"run {summary.run_id} {status}: MODE={summary.mode}, {summary.nodes} node(s), world size "
             f"{summary.world_size}, wall {summary.wall_seconds:.1f} s"]
    for node, code in summary.exit_codes.items():
        lines.append(f"  {node}: exit {'lost' if code is None else code}")
    if summary.failed_node:
        rank = "unknown" if summary.failed_rank is None else summary.failed_rank
        lines.append(f"  first failure: {summary.failed_node}, rank {rank}")
        if summary.cause:
            lines.append(f"  root cause: {summary.failed_node} {summary.cause}")
        if summary.stacks:
            lines.append(f"  stacks at failure: {summary.stacks}/ (stacks.txt: grouped; node-i.txt: every thread)")
    if summary.preempted:
        lines += preempted_lines(summary)
    for slow in summary.slow_ranks or ():
        lines.append(f"  slow rank: {slow['node']} rank {slow['rank']}, compute {slow['compute_ms']:.1f} ms per step "
                     f"against {slow['others_ms']:.1f} ms on the other ranks ({slow['ratio']:.1f}x)")
    if summary.links and summary.links.get("after_failure"):
        lines.append(f"  links after the failure: {summary.links['verdict']}")
    elif summary.links and summary.links.get("verdict", "ok") != "ok":
        lines.append(f"  link check (warning): {summary.links['verdict']}")
    if summary.result:
        acc = summary.result.get("test_accuracy")
        if acc is not None:
            lines.append(f"  test accuracy: {acc:.4f}")
        if "collective_ok" in summary.result:
            lines.append(f"  collective correct: {summary.result['collective_ok']}")
    lines.append(f"  logs: {summary.log_dir}")
    if summary.metrics:
        lines.append(f"  metrics: {summary.metrics}")
    return "\n".join(lines)


def preempted_lines(summary: RunSummary) -> list[str]:
    """What a preempted run kept and how to go on (the report's fields: training/checkpoint.py)."""
    report = summary.preempted
    stop = report.get("stopped_at", {})
    lines = [f"  notice: {report.get('notice', '?')} on {report.get('noticed_on', '?')}",
             f"  every rank stopped at epoch {stop.get('epoch')}, batch {stop.get('batch')} (step {stop.get('step')}); "
             f"checkpoint {report.get('checkpoint_seconds', '?')} s"]
    lines += [f"  snapshot copy: rank {rank} on {host}: {path}" for rank, host, path in report.get("copies", [])]
    lines.append(f"  resume: make train RESUME=1 with the same settings (or --run-id {summary.run_id}); it starts "
                 "from the freshest complete copy on any node")
    return lines
