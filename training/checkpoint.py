"""A Trainer's snapshot: what of it goes into one (model, optimizer, scheduler, grad scaler, RNG states,
the NEXT epoch and the samples of it already trained, the global batch, the world size, the optimizer steps
so far, the early-stopping state and the loss before training) and how it comes back on resume.
Storage, atomic writes and the choice of the freshest snapshot across ranks are :mod:`training.snapshot`'s;
the copy on a second node is :mod:`training.replica`'s (every rank calls :func:`save`; rank 0 writes).

A preemption snapshot (:func:`save_preempted`) is taken mid-epoch: ``next_epoch`` is the epoch in progress and
``consumed`` the number of its samples already trained (snapshots from before it hold ``batch``, the batches
per rank, read as ``batch x batch size x world size``). A resumed run continues that epoch's order from there
(:mod:`training.sampler`) with the snapshot's global batch on however many ranks it has now: the same world
size continues bitwise; another one re-shards the rest of the epoch and recomputes the accumulation. Rank 0
logs the plan and prints ``RESUMED {json}`` (epoch, consumed, step, world_size_before, world_size,
global_batch, accum, micro_batch, snapshot_from).

With CHECKPOINT_URL (``MULTINODE_CHECKPOINT_URL``), rank 0 hands every snapshot it wrote, with the checksum written
beside it, to the background uploader (:mod:`training.upload`); a start that finds no snapshot on any rank takes
the run's freshest complete copy from the bucket (``snapshot_from`` is then its ``s3://`` URL), and
:func:`finish_uploads` waits for the uploads in flight and reports their time.

``--crash-during-snapshot k`` (a drill) SIGKILLs rank 0 halfway through writing the snapshot that follows
epoch k, on the job's first attempt only, so the restarted job resumes from the previous snapshot.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import torch

from . import channel, replica, sampler, snapshot

from . import upload

log = logging.getLogger("training")


def restore(trainer) -> dict | None:
    """Load the freshest snapshot any rank holds into ``trainer``, its batch plan included; what rank 0 prints
    as ``RESUMED`` (None when there is no snapshot: a fresh start)."""
    t, world = trainer.t, trainer.world
    remote = upload.fetch_freshest if upload.where() else None  # when no rank holds a snapshot
    loaded = snapshot.load_freshest(t.snapshot_dir, world.rank, trainer.gather, trainer.broadcast, remote)
    if loaded is None:
        if remote is not None:
            log.info("no snapshot on any rank nor of this run in %s: a fresh start", upload.where()[0])
        return None
    state = loaded.state
    before = apply(trainer, state)
    done = trainer.start_consumed
    within = f" batch {-(-done // trainer.plan.global_batch)} (consumed {done} samples)" if done else ""
    log.info("resumed from snapshot: next epoch %d%s", trainer.start_epoch, within)
    if before != world.world_size:
        log.info("resized: %d ranks -> %d, the same global batch", before, world.world_size)
    return {"epoch": trainer.start_epoch, "consumed": done, "step": trainer.step, "world_size_before": before,
            "world_size": world.world_size, "global_batch": trainer.plan.global_batch,
            "accum": trainer.plan.accum, "micro_batch": trainer.plan.micro_batch,
            "snapshot_from": f"{loaded.host}:{loaded.path}" if loaded.host else loaded.path,
            "survivor": bool(state.get("survivor"))}  # the surviving ranks' last completed step (training/survivor.py)


def apply(trainer, state: dict) -> int:
    """``state`` (a snapshot's, or a live peer's: :func:`state_of`) loaded into ``trainer``, its global batch over
    this world's ranks; the world size it was taken on."""
    t, world = trainer.t, trainer.world
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    snapshot.set_rng_state(state["rng"])
    before = int(state.get("world_size", world.world_size))
    fresh = sampler.BatchPlan.fresh(t.batch_size, t.grad_accum, before)
    trainer.plan = sampler.BatchPlan(int(state.get("global_batch", fresh.global_batch)), world.world_size, t.batch_size)
    trainer.start_epoch = state["next_epoch"]
    # before `consumed`: `batch` batches of `batch_size` on each rank
    old = int(state.get("batch", 0)) * t.batch_size * before
    trainer.start_consumed = min(int(state.get("consumed", old)), len(trainer.workload.train))
    trainer.step = int(state.get("step", 0))
    trainer.initial_test_loss = state.get("initial_test_loss")
    trainer.best, trainer.stale = state.get("early_stopping", (float("inf"), 0))
    return before


def state_of(trainer, next_epoch: int, consumed: int) -> dict:
    """What a snapshot holds of ``trainer`` now, to resume at ``next_epoch`` after ``consumed`` samples of it."""
    return {
        "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(), "scaler": trainer.scaler.state_dict(),
        "rng": snapshot.rng_state(), "next_epoch": next_epoch, "consumed": consumed,
        "global_batch": trainer.plan.global_batch, "world_size": trainer.world.world_size, "step": trainer.step,
        "workload": trainer.t.workload,
        "initial_test_loss": trainer.initial_test_loss, "early_stopping": (trainer.best, trainer.stale),
    }


def save(trainer, next_epoch: int, consumed: int = 0) -> replica.Copies | None:
    """Every rank, at the same point, with a snapshot directory: rank 0 writes ``trainer``'s snapshot (to resume
    at ``next_epoch``, after ``consumed`` samples of it), a rank on another node keeps a verified copy. Its time is
    a periodic checkpoint stall of the ledger (:mod:`training.marks`)."""
    if not trainer.t.snapshot_dir:
        return None
    with trainer.marks.checkpoint("periodic"):
        return _save(trainer, next_epoch, consumed)


def _save(trainer, next_epoch: int, consumed: int) -> replica.Copies | None:
    blob = None
    if trainer.world.rank == 0:
        blob = snapshot.encode(state_of(trainer, next_epoch, consumed))
        path = snapshot.write(trainer.t.snapshot_dir, blob, before_rename=trainer.faults.before_rename(next_epoch))
        if trainer.uploader is not None:  # the file, streamed from disk, and the checksum written beside it
            digest = (path.parent / snapshot.SUM).read_text().split()[0]
            trainer.uploader.submit(path, next_epoch * snapshot.BATCH_SPAN + consumed, digest)
        log.info("snapshot saved: %s (next epoch %d%s)", path, next_epoch,
                 f" consumed {consumed} samples" if consumed else "")
    if trainer.world.backend is None:
        return replica.Copies([(0, socket.gethostname(), str(Path(trainer.t.snapshot_dir) / snapshot.NAME))])
    copies = replica.replicate(blob, trainer.t.snapshot_dir, trainer.world.rank, trainer.hosts, trainer.gather,
                               trainer.device if trainer.world.backend == "nccl" else torch.device("cpu"))
    if len(copies.places) < 2:
        log.warning("snapshot has one copy only: every rank runs on %s", copies.places[0][1])
    return copies


def save_preempted(trainer, epoch: int, consumed: int) -> dict:
    """Every rank, at the agreed step, after ``consumed`` samples of ``epoch``: one snapshot mid-epoch,
    replicated, and (rank 0) the report printed as ``PREEMPTED {json}`` and written to
    ``<metrics dir>/preempted.json``. Its batch is the optimizer steps of the epoch, its step those since the start."""
    watcher, step = trainer.watcher, trainer.step
    batch = -(-consumed // trainer.plan.global_batch)
    log.warning("preempted: every rank stops at epoch %d batch %d (step %d)", epoch, batch, step)
    mine = None if watcher.notice is None or watcher.notice.kind == "peer" else (
        watcher.noticed_at, watcher.notice.describe(), socket.gethostname())
    seen = trainer.gather(mine)
    start = time.time()
    trainer.marks.done()  # the last step of this attempt; the snapshot is a coordinated checkpoint stall
    with trainer.marks.checkpoint("coordinated"):
        copies = _save(trainer, epoch, consumed) if trainer.t.snapshot_dir else None
        uploaded = None
        if trainer.uploader is not None:  # the coordinated checkpoint goes up before the rank exits, within the grace
            left = watcher.seconds_left()
            uploaded = trainer.uploader.drain(max(1.0, left - 5.0) if left is not None else 90.0)
    first = min(((n, r) for r, n in enumerate(seen) if n), default=(None, None))
    report = {"notice": first[0][1] if first[0] else None, "noticed_by_rank": first[1],
              "noticed_on": first[0][2] if first[0] else None, "noticed_at": first[0][0] if first[0] else None,
              "stopped_at": {"epoch": epoch, "batch": batch, "step": step}, "stopped_time": start,
              "checkpoint_seconds": round(time.time() - start, 3), "snapshot": {"next_epoch": epoch, "batch": batch, "consumed": consumed},
              "copies": copies.places if copies else [], "exit_code": channel.EXIT_PREEMPTED}
    if uploaded is not None:
        last = trainer.uploader.uploaded[-1:]
        ours = last and last[0]["order"] == epoch * snapshot.BATCH_SPAN + consumed
        report["uploaded"] = last[0]["url"] if uploaded and ours else None  # None: not (yet) in the bucket
    if trainer.world.rank == 0:
        channel.send(channel.PREEMPTED, report)
        if trainer.t.metrics_dir:
            Path(trainer.t.metrics_dir).mkdir(parents=True, exist_ok=True)
            (Path(trainer.t.metrics_dir) / "preempted.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def finish_uploads(trainer, timeout: float = 120.0) -> dict:
    """Rank 0 with CHECKPOINT_URL: wait for the uploads in flight (at most ``timeout`` seconds); what RESULT
    carries of them (``checkpoint_uploads``, ``checkpoint_upload_seconds``: their time, spent beside the steps)."""
    uploader = getattr(trainer, "uploader", None)
    if uploader is None:
        return {}
    if not uploader.drain(timeout):
        log.warning("checkpoint upload to %s still running after %.0f s; not waiting longer", uploader.url, timeout)
    return {"checkpoint_uploads": len(uploader.uploaded), "checkpoint_upload_seconds": round(uploader.seconds, 3)}


def save_rebalance(trainer, epoch: int, consumed: int) -> replica.Copies | None:
    """Every rank, at the step they agreed on for a rebalance recommendation: the snapshot :func:`save_preempted`
    would write (mid-epoch, replicated), and the job goes on -- no report, no exit. Rank 0 says who noticed it."""
    mine = trainer.agreement.rebalance
    seen = trainer.gather(None if mine is None else (mine.describe(), socket.gethostname()))
    first = next((entry for entry in seen if entry), ("a rebalance recommendation", "?"))
    batch = -(-consumed // trainer.plan.global_batch)
    if trainer.world.rank == 0:
        log.info("%s on %s: one coordinated checkpoint at epoch %d batch %d (step %d); the job goes on",
                 first[0], first[1], epoch, batch, trainer.step)
    with trainer.marks.checkpoint("coordinated"):  # the ledger's coordinated stall, though the job goes on
        return _save(trainer, epoch, consumed) if trainer.t.snapshot_dir else None
