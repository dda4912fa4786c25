"""A Trainer's snapshot: what of it goes into one (model, optimizer, scheduler, grad scaler, RNG states,
the NEXT epoch, the early-stopping state and the loss before training) and how it comes back on resume.
Storage, atomic writes and the choice of the freshest snapshot across ranks are :mod:`training.snapshot`'s;
the copy on a second node is :mod:`training.replica`'s (every rank calls :func:`save`; rank 0 writes).

A preemption snapshot (:func:`save_preempted`) is taken mid-epoch: ``next_epoch`` is the epoch in progress and
``batch`` the number of its batches already trained; a resumed run skips those batches of that epoch (the
sampler's order is a function of seed and epoch) and restores the RNG states after creating its data
iterator, so it continues bitwise where the preempted run stopped.

``--crash-during-snapshot k`` (a drill) SIGKILLs rank 0 halfway through writing the snapshot that follows
epoch k, on the job's first attempt only, so the restarted job resumes from the previous snapshot.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

import torch

from training import preempt, replica, snapshot

log = logging.getLogger("training")


def restore(trainer) -> None:
    """Load the freshest snapshot any rank holds into ``trainer`` (nothing when there is none)."""
    state = snapshot.load_everywhere(trainer.t.snapshot_dir, trainer.world.rank, trainer.gather, trainer.broadcast)
    if state is None:
        return
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    snapshot.set_rng_state(state["rng"])
    trainer.start_epoch = state["next_epoch"]
    trainer.start_batch = int(state.get("batch", 0))
    trainer.resume_rng = state["rng"] if trainer.start_batch else None
    trainer.initial_test_loss = state.get("initial_test_loss")
    trainer.best, trainer.stale = state.get("early_stopping", (float("inf"), 0))
    within = f" batch {trainer.start_batch}" if trainer.start_batch else ""
    log.info("resumed from snapshot: next epoch %d%s", trainer.start_epoch, within)


def _state(trainer, next_epoch: int, batch: int) -> dict:
    return {
        "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(), "scaler": trainer.scaler.state_dict(),
        "rng": snapshot.rng_state(), "next_epoch": next_epoch, "batch": batch, "workload": trainer.t.workload,
        "initial_test_loss": trainer.initial_test_loss, "early_stopping": (trainer.best, trainer.stale),
    }


def save(trainer, next_epoch: int, batch: int = 0) -> replica.Copies | None:
    """Every rank, at the same point, with a snapshot directory: rank 0 writes ``trainer``'s snapshot (to resume
    at ``next_epoch``, after ``batch`` batches of it), a rank on another node keeps a verified copy."""
    if not trainer.t.snapshot_dir:
        return None
    blob = None
    if trainer.world.rank == 0:
        crash = None
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if next_epoch - 1 == trainer.t.crash_during_snapshot and first_attempt:
            crash = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731  (a drill: die mid-write)
        blob = snapshot.encode(_state(trainer, next_epoch, batch))
        path = snapshot.write(trainer.t.snapshot_dir, blob, before_rename=crash)
        log.info("snapshot saved: %s (next epoch %d%s)", path, next_epoch, f" batch {batch}" if batch else "")
    if trainer.world.backend is None:
        return replica.Copies([(0, socket.gethostname(), str(Path(trainer.t.snapshot_dir) / snapshot.NAME))])
    copies = replica.replicate(blob, trainer.t.snapshot_dir, trainer.world.rank, trainer.hosts, trainer.gather,
                               trainer.device if trainer.world.backend == "nccl" else torch.device("cpu"))
    if len(copies.places) < 2:
        log.warning("snapshot has one copy only: every rank runs on %s", copies.places[0][1])
    return copies


def save_preempted(trainer, epoch: int, batch: int, step: int) -> dict:
    """Every rank, at the agreed step: one snapshot mid-epoch, replicated, and (rank 0) the report printed as
    ``PREEMPTED {json}`` and written to ``<metrics dir>/preempted.json``."""
    watcher = trainer.watcher
    log.warning("preempted: every rank stops at epoch %d batch %d (step %d)", epoch, batch, step)
    mine = None if watcher.notice is None or watcher.notice.kind == "peer" else (
        watcher.noticed_at, watcher.notice.describe(), socket.gethostname())
    seen = trainer.gather(mine)
    start = time.time()
    copies = save(trainer, epoch, batch)
    first = min(((n, r) for r, n in enumerate(seen) if n), default=(None, None))
    report = {"notice": first[0][1] if first[0] else None, "noticed_by_rank": first[1],
              "noticed_on": first[0][2] if first[0] else None, "noticed_at": first[0][0] if first[0] else None,
              "stopped_at": {"epoch": epoch, "batch": batch, "step": step}, "stopped_time": start,
              "checkpoint_seconds": round(time.time() - start, 3), "snapshot": {"next_epoch": epoch, "batch": batch},
              "copies": copies.places if copies else [], "exit_code": preempt.EXIT_PREEMPTED}
    if trainer.world.rank == 0:
        print("PREEMPTED " + json.dumps(report), flush=True)
        if trainer.t.metrics_dir:
            Path(trainer.t.metrics_dir).mkdir(parents=True, exist_ok=True)
            (Path(trainer.t.metrics_dir) / "preempted.json").write_text(json.dumps(report, indent=1) + "\n")
    return report

