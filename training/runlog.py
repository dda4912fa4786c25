"""What a training run leaves in its metrics directory, besides snapshots and the final model.

* ``metrics.jsonl`` (rank 0): one line per epoch (loss, accuracy, samples/s, step and communication time)
  and a final test line;
* ``samples.jsonl`` (rank 0, only with ``--log-samples``): one line per optimizer step,
  ``{"epoch", "step", "ids"}`` with every rank's sample indices of that step (rank 0's first), so a run can be
  checked to train every sample exactly once per epoch, across a resume on another number of ranks;
* ``heartbeat-rank<R>`` (every rank; :func:`training.channel.heartbeat_name`): this rank's optimizer step count as
  text, rewritten (atomically) at most once a second after a step or an evaluation batch. The launcher's stall
  watchdog (STALL_TIMEOUT) reads its modification time as the rank's progress, recovery its step.

Both ``.jsonl`` files are appended to: a resumed run continues them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from . import channel

HEARTBEAT_SECONDS = 1.0
log = logging.getLogger("training")


class RunLog:
    def __init__(self, metrics_dir: str | None, rank: int, log_samples: bool = False):
        self.dir = Path(metrics_dir) if metrics_dir else None
        self.rank = rank
        self._last_beat = 0.0
        self.metrics = self._open("metrics.jsonl") if rank == 0 else None
        self.samples = self._open("samples.jsonl") if rank == 0 and log_samples else None

    def _open(self, name: str):
        if self.dir is None:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        return open(self.dir / name, "a", encoding="utf-8")

    @staticmethod
    def _write(fh, row: dict) -> None:
        if fh is not None:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def record(self, **row) -> None:
        """A line of ``metrics.jsonl`` (rank 0; nothing elsewhere)."""
        self._write(self.metrics, row)

    def epoch(self, row: dict, total_epochs: int) -> None:
        """An epoch's line of ``metrics.jsonl`` and of the log (``epoch 3/10 loss ... val_loss ...``)."""
        self.record(**row)
        acc = f" val_acc {row['val_accuracy']:.4f}" if row.get("val_accuracy") is not None else ""
        log.info("epoch %d/%d loss %.5f val_loss %.5f%s %.0f samples/s step %.1f ms comm %.1f ms", row["epoch"] + 1,
                 total_epochs, row["loss"], row["val_loss"], acc, row["samples_per_s"],
                 1000 * (row["step_time_s"] or 0), 1000 * row["comm_time_s"])

    def step_samples(self, epoch: int, step: int, ids_by_rank: list[list[int]]) -> None:
        """A line of ``samples.jsonl``: the step's sample indices, rank by rank."""
        self._write(self.samples, {"epoch": epoch, "step": step, "ids": [i for ids in ids_by_rank for i in ids]})

    def heartbeat(self, step: int, force: bool = False) -> None:
        """``heartbeat-rank<R>`` holds ``step``, rewritten at most once a second unless ``force`` (a new file
        renamed over the old one, so a reader never sees it half written)."""
        now = time.monotonic()
        if self.dir is None or (now - self._last_beat < HEARTBEAT_SECONDS and not force):
            return
        self._last_beat = now
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / channel.heartbeat_name(self.rank)
        tmp = self.dir / f".{channel.heartbeat_name(self.rank)}.tmp"
        tmp.write_text(f"{step}\n", encoding="utf-8")
        os.replace(tmp, path)

    def close(self) -> None:
        for fh in (self.metrics, self.samples):
            if fh is not None:
                fh.close()
        self.metrics = self.samples = None
