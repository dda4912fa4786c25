"""The end of an epoch, every rank at the same point: validation, the epoch's record, the periodic snapshot, the
early-stopping vote -- and the evaluation it (and the final test) runs on every rank's shard.

Early stopping is tracked on every rank (the same summed loss), rank 0's decision broadcast, so every rank stops at
the same epoch and a survivor's snapshot on any rank carries it. The validation loader draws its seed before the
first collective of this stretch (:func:`training.survivor.keep_between` keeps the whole epoch when a peer is lost
here)."""

from __future__ import annotations

import logging

import torch
from torch.utils.data import DataLoader

from . import checkpoint

log = logging.getLogger("training")


class StoppedAfterEpoch(Exception):
    """``--stop-after-epoch k``: every rank stops right after epoch k (and its snapshot) on purpose."""


def end_epoch(trainer, epoch: int, local: dict) -> bool:
    """After ``epoch``'s last step: validation, the epoch's record, the periodic snapshot, the early-stopping
    vote; whether to stop. The validation loader draws its seed before the first collective (survivor.py)."""
    val = evaluate(trainer, trainer.val_loader)
    loss_sum, n = trainer.world.all_sum([local.pop("loss_sum"), local.pop("samples")], trainer.device)
    trainer.runlog.epoch({"epoch": epoch, "step": trainer.step, "loss": loss_sum / n if n else float("nan"),
                          "samples_per_s": round(n / local.pop("elapsed"), 1), **local, "val_loss": val["loss"],
                          "val_accuracy": val.get("accuracy"),
                          "step_time_by_rank": trainer.gather(local["step_time_s"])}, trainer.t.total_epochs)
    stop = None
    if trainer.t.patience:  # on every rank (the same summed loss): a survivor's snapshot on any rank carries it
        trainer.stale = 0 if val["loss"] < trainer.best else trainer.stale + 1
        trainer.best = min(trainer.best, val["loss"])
        stop = trainer.stale >= trainer.t.patience
    saved = (epoch + 1) % trainer.t.save_every == 0 or epoch + 1 == trainer.t.total_epochs
    if saved:
        checkpoint.save(trainer, epoch + 1)
    trainer.faults.after_epoch(epoch, trainer.world.rank, trainer.world.world_size)
    asked = epoch == trainer.t.stop_after_epoch  # the same on every rank: no vote
    stop = asked or bool(trainer.broadcast(stop))
    if stop and not saved:
        checkpoint.save(trainer, epoch + 1)  # whatever save_every says: the run resumes from here
    if asked:
        raise StoppedAfterEpoch(f"stopped after epoch {epoch + 1} as asked (--stop-after-epoch {epoch})")
    if stop:
        log.info("early stopping after epoch %d: no val-loss improvement for %d epochs", epoch + 1, trainer.stale)
    return stop


@torch.no_grad()
def evaluate(trainer, loader: DataLoader) -> dict:
    """Loss (and accuracy) over this rank's shard of ``loader``, summed across the ranks; a heartbeat per batch."""
    trainer.net.eval()
    loss_sum, correct, n = 0.0, 0.0, 0.0
    for x, y in loader:
        x, y = x.to(trainer.device), y.to(trainer.device)
        with trainer.autocast():
            out = trainer.model(x)
        loss_sum += trainer.workload.loss(out.float(), y).item() * len(x)
        if trainer.workload.classification:
            correct += (out.argmax(1) == y).sum().item()
        n += len(x)
        trainer.runlog.heartbeat(trainer.step)
    loss_sum, correct, n = trainer.world.all_sum([loss_sum, correct, n], trainer.device)
    result = {"loss": loss_sum / n}
    if trainer.workload.classification:
        result["accuracy"] = correct / n
    return result
