"""A Trainer's snapshot: what of it goes into one (model, optimizer, scheduler, grad scaler, RNG states,
the NEXT epoch, the early-stopping state and the loss before training) and how it comes back on resume.
Storage, atomic writes and the choice of the freshest snapshot across ranks are :mod:`training.snapshot`'s.

``--crash-during-snapshot k`` (a drill) SIGKILLs rank 0 halfway through writing the snapshot that follows
epoch k, on the job's first attempt only, so the restarted job resumes from the previous snapshot.
"""

from __future__ import annotations

import logging
import os
import signal

from training import snapshot

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
    trainer.initial_test_loss = state.get("initial_test_loss")
    trainer.best, trainer.stale = state.get("early_stopping", (float("inf"), 0))
    log.info("resumed from snapshot: next epoch %d", trainer.start_epoch)


def save(trainer, next_epoch: int) -> None:
    """On global rank 0, with a snapshot directory: ``trainer``'s snapshot, to resume at ``next_epoch``."""
    if trainer.world.rank != 0 or not trainer.t.snapshot_dir:
        return
    crash = None
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if next_epoch - 1 == trainer.t.crash_during_snapshot and first_attempt:
        crash = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731  (a drill: die mid-write)
    path = snapshot.save(trainer.t.snapshot_dir, {
        "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(), "scaler": trainer.scaler.state_dict(),
        "rng": snapshot.rng_state(), "next_epoch": next_epoch, "workload": trainer.t.workload,
        "initial_test_loss": trainer.initial_test_loss, "early_stopping": (trainer.best, trainer.stale),
    }, before_rename=crash)
    log.info("snapshot saved: %s (next epoch %d)", path, next_epoch)
