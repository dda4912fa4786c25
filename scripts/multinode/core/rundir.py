"""A run's directory on the control machine, and its layout: the one place that knows it.

    runs/<run-id>/
        node-<i>.log        each node's output (the job's lines, prefixed)
        plan.json           the launch plan (SSH) -- job.sbatch for SLURM
        summary.json        how the run ended (multinode.app.ending.save writes it, and only it)
        recovery.json       a recovering run's timeline
        metrics.jsonl       rank 0's metrics, fetched from the head at the end
        stacks/             the live ranks' stacks when a failed job was stopped
        <label>/            an earlier attempt of a recovering run, kept whole when the next one starts: the same
                            names inside (``attempt-<k>``: recovered from; ``grow-<k>``: grew back)

Every attempt of a run writes the same names; :meth:`RunDir.keep` moves an ended attempt's files aside, and
:meth:`RunDir.attempts` lists the kept ones in the order they ended (each one's ``summary.json`` is written as its
attempt ends), then the directory itself: the latest attempt.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

SUMMARY, RECOVERY, METRICS, PLAN, STACKS = "summary.json", "recovery.json", "metrics.jsonl", "plan.json", "stacks"
KEPT_PREFIXES = ("attempt-", "grow-")


@dataclass(frozen=True)
class RunDir:
    """``runs/<run-id>/`` of one run (see the module doc)."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def recovery(self) -> Path:
        return self.path / RECOVERY

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    def node_log(self, node: str) -> Path:
        return self.path / f"{node}.log"

    @staticmethod
    def kept_label(kind: str, number: int) -> str:
        """The directory an ended attempt is kept in: ``attempt-<k>`` (recovered from) or ``grow-<k>`` (grew back)."""
        if kind not in ("attempt", "grow"):
            raise ValueError(f"unknown kept attempt kind {kind!r}; attempt or grow")
        return f"{kind}-{number}"

    def keep(self, label: str) -> Path:
        """The ended attempt's files moved into ``label/`` (the next attempt writes the same names); its path."""
        keep = self.path / label
        keep.mkdir(parents=True, exist_ok=True)
        for entry in list(self.path.iterdir()):
            if not entry.name.startswith(KEPT_PREFIXES):
                shutil.move(str(entry), keep / entry.name)
        return keep

    def attempts(self) -> list[Path]:
        """Every attempt's directory in the order they ended: the kept ones (by when their summary was written),
        then the run directory itself (the latest)."""
        kept = [p for p in self.path.iterdir() if p.is_dir() and p.name.startswith(KEPT_PREFIXES)] \
            if self.path.is_dir() else []
        kept.sort(key=lambda p: ((p / SUMMARY).stat().st_mtime if (p / SUMMARY).exists() else 0.0, p.name))
        return kept + [self.path]


def runs(runs_dir: Path) -> list[RunDir]:
    """Every run directory under ``runs_dir``, oldest first (run ids sort by their start)."""
    return [RunDir(p) for p in sorted(runs_dir.glob("*")) if p.is_dir()] if runs_dir.exists() else []
