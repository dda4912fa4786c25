"""The Trainer, in the shape of pytorch/examples' multinode Trainer, minus its bugs.

* the batch order of :mod:`training.sampler`: DistributedSampler's shuffle (a different one every epoch, the
  same on every rank), cut into optimizer steps of one global batch ``G`` (``--batch-size x --grad-accum x
  world size`` on a fresh start, the snapshot's on a resume), each rank's share of a step in micro-batches of
  at most ``--batch-size``; no padding: every sample once per epoch. Rank 0 logs ``global batch G = W ranks x
  S samples (A micro-batches of up to M)`` at the start (a resume on another world size is a resize);
* gradients averaged by DDP (gloo/NCCL/RCCL) or by MPI (``mpi_plane``), with gradient accumulation
  (``no_sync`` on the micro-steps in between), each micro-batch's mean loss weighted by its share of the step
  so the gradient is the step's mean whatever the world size; AMP on GPU (bf16, or fp16 with a GradScaler);
* validation every epoch with loss and accuracy summed across ranks; test at the end;
* early stopping tracked on every rank (the same summed loss), rank 0's decision broadcast, so every rank stops
  at the same epoch;
* snapshots of the NEXT epoch (a resumed run never repeats one) with optimizer, scheduler, scaler
  and RNG states, the global batch, the world size and the step count, written by global rank 0 atomically;
  on resume the rank holding the freshest snapshot broadcasts it (after an elastic restart that need not be
  rank 0) and rank 0 prints ``RESUMED {json}`` -- :mod:`training.checkpoint`;
  ``--stop-after-epoch k`` ends every rank right after epoch k's snapshot (StoppedAfterEpoch);
  a copy of every snapshot is kept on a second node (:mod:`training.replica`);
* a spot notice or SIGTERM (:mod:`training.preempt`): every rank stops after the same step, one mid-epoch
  snapshot is written and replicated (Preempted, exit 75); a resume continues at that sample: on the same
  world size bitwise, on another one with the same global batch; a rebalance recommendation: the same snapshot
  at the same step on every rank, and training goes on;
* ``metrics.jsonl``, ``samples.jsonl``, the heartbeat -- :mod:`training.runlog`; the ledger's -- :mod:`training.marks`;
  what rides along with every step (the sample log, a drill's pace, the step times, the heartbeat and marks, the
  notice agreement) -- the listeners of :mod:`training.steps`;
* a job whose membership the run may change (``MULTINODE_MEMBERSHIP``, :mod:`training.membership`): a lost peer or
  a noticed node's departure is a pause, not an end -- the surviving ranks keep their processes and the last
  completed step in memory, form the run's new world, and the epoch goes on re-sharded at the same global batch
  (:mod:`training.reform`); a new node's ranks join the running world and take their state from a live peer.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import (channel, checkpoint, epoch_end, marks, membership, preempt, reform, replica, sampler, steps, survivor,
               upload)
from .ddp_comm import CommTimer, settle_buckets
from .config import Config
from .dist_env import World
from .epoch_end import StoppedAfterEpoch  # noqa: F401 -- train.py's, with the trainer's other endings
from .faults import Faults
from .hosting import ChangeHost
from .mpi_plane import MpiGradients
from .runlog import RunLog
from .steptimes import StepTimes
from .workloads import Workload


log = logging.getLogger("training")


class Preempted(Exception):
    """A notice: every rank stopped at the same step and the snapshot of that step is written."""

    def __init__(self, report: dict):
        super().__init__(f"preempted at epoch {report['stopped_at']['epoch']} batch {report['stopped_at']['batch']}")
        self.report = report


class Trainer(ChangeHost):
    def __init__(self, cfg: Config, world: World, workload: Workload, device: torch.device, data_plane: str,
                 faults: Faults | None = None):
        self.cfg, self.t = cfg, cfg.training
        self.world, self.workload, self.device = world, workload, device
        self.data_plane, self.faults = data_plane, faults or Faults()
        self.model = workload.model.to(device)
        lr = self.t.lr or workload.lr
        # CPU: the fused kernels update every parameter in one pass (~1.5 ms less per step on 5 M parameters
        # than the per-tensor loop); GPU keeps torch's default (foreach), which is already one launch per group.
        fused = {"fused": True} if device.type == "cpu" else {}
        if workload.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9, **fused)
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr, **fused)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=self.t.total_epochs)
        amp = self.t.amp
        if amp == "auto" and device.type == "cuda":
            amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp) if device.type == "cuda" else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype is torch.float16)
        self.mpi: MpiGradients | None = None
        self.timer = CommTimer()
        self.start_epoch, self.start_consumed = 0, 0  # a mid-epoch snapshot sets the samples already trained
        self.step = 0  # optimizer steps since the start of training; kept in snapshots
        self.plan = sampler.BatchPlan.fresh(self.t.batch_size, self.t.grad_accum, world.world_size)
        self.initial_test_loss: float | None = None  # before any training; kept in snapshots
        self.best, self.stale = float("inf"), 0  # early stopping (every rank); kept in snapshots
        self.uploader = upload.Uploader.from_env() if world.rank == 0 else None  # CHECKPOINT_URL: rank 0 uploads
        joining = world.joining is not None
        if joining:  # a new node's rank in a running job, built: in, and its state from a live peer (membership.py)
            self.faults.before_join()
            self.start_epoch, self.start_consumed = membership.join(self, cfg.distributed.timeout)
        else:
            resumed = checkpoint.restore(self)  # a snapshot's global batch replaces the fresh plan's
            if resumed is not None and world.rank == 0:
                channel.send(channel.RESUMED, resumed)
        log.info("%s", self.plan.describe())
        if data_plane == "mpi":
            self.mpi = MpiGradients(self.model, world.comm, device)
            self.mpi.broadcast_parameters()
        self.runlog = RunLog(self.t.metrics_dir, world.rank, self.t.log_samples)
        self.steptimes: StepTimes | None = None  # join_world's, for each world
        self.join_world()
        self.watcher = preempt.watch()  # spot notices and (with MULTINODE_GRACE) SIGTERM
        device_for_sum = device if world.backend == "nccl" else None
        self.agreement = preempt.Agreement(self.watcher, preempt.torch_all_reduce_max(device_for_sum),
                                           reform.members(self.world))
        self.marks = marks.Marks(world.rank == 0)  # the ledger's steps and checkpoint stalls (training/marks.py)
        self.listeners = steps.listeners()
        if world.member is not None and not joining and world.rank == 0:
            channel.send(channel.WORLD, {"generation": 0, "step": self.step, "world_size": world.world_size,
                                         "before": world.world_size, "seconds": 0.0})  # the job takes changes

    # --- plumbing -----------------------------------------------------------------------

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order (the job's object collective)."""
        return self.world.gather(obj)

    def broadcast(self, obj, src: int = 0):
        return self.world.broadcast(obj, src)

    def join_world(self) -> None:
        """What depends on the world the ranks are in: the batch plan (the same global batch over these ranks), the
        gradient average (DDP on this world's group), the evaluation shards, the snapshot's second host, the step
        times' rank. At the start, and again in every new world (every rank of it, at the same point)."""
        world = self.world
        self.plan = sampler.BatchPlan(self.plan.global_batch, world.world_size, self.t.batch_size)
        if self.mpi is not None:
            self.net: nn.Module = self.model
        elif world.backend is not None:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = DDP(self.model, device_ids=ids, find_unused_parameters=self.t.find_unused_parameters)
            self.net.register_comm_hook(dist.group.WORLD, self.timer.hook)
            settle_buckets(self.net, self.workload.train, self.device)  # the same bucket layout fresh or resumed
        else:
            self.net = self.model
        self.val_loader = self._loader(self.workload.val)
        self.test_loader = self._loader(self.workload.test)
        self.runlog.rank = world.rank
        if self.steptimes is not None:  # the old world's last, partial window: its steps count too (the ledger's)
            self.steptimes.emit()
        self.steptimes = StepTimes(world.rank, world=world.world_size)  # every rank: compared while the job trains
        self.hosts = replica.hosts(self.gather) if self.t.snapshot_dir and world.backend else []

    def _loader(self, dataset) -> DataLoader:
        """Evaluation: a strided shard per rank, without padding, so every sample is counted exactly once.
        (Training batches come from :mod:`training.sampler`.)"""
        shard = range(self.world.rank, len(dataset), self.world.world_size)
        return DataLoader(dataset, batch_size=self.t.batch_size, sampler=shard)

    # --- training ---------------------------------------------------------------------

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor, divisor: float, boundary: bool) -> float:
        """Forward and backward of one micro-batch, its mean loss divided by ``divisor`` (its weight in the
        step, :func:`training.sampler.loss_divisor`); at the step's last micro-batch, average the gradients
        (DDP does it inside backward, the MPI plane here) and step. Returns the micro-batch's summed loss.
        An empty micro-batch (a rank with nothing left in the epoch's last step) still runs backward, on a zero
        loss, so this rank takes part in the gradient average."""
        sync_ctx = self.net.no_sync() if isinstance(self.net, DDP) and not boundary else contextlib.nullcontext()
        with sync_ctx:
            with self.autocast():
                out = self.net(x)
                mean = self.workload.loss(out, y) if len(x) else out.float().sum() * 0.0
                loss = mean / divisor
            self.scaler.scale(self.mpi.prescale(loss) if self.mpi else loss).backward()
        if boundary:
            if self.mpi:
                self.mpi.average()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        return mean.item() * len(x)

    def _run_step(self, step: sampler.Step) -> float:
        """This rank's micro-batches of one optimizer step; their summed loss."""
        total = 0.0
        last = len(step.micro_batches) - 1
        for k, ids in enumerate(step.micro_batches):
            x, y = self.workload.train[torch.tensor(ids, dtype=torch.long)]
            divisor = sampler.loss_divisor(len(ids), self.world.world_size, step.size) if ids else 1.0
            total += self._run_batch(x.to(self.device), y.to(self.device), divisor, boundary=k == last)
        return total

    def _one_step(self, epoch: int, step: sampler.Step, stats: steps.EpochStats) -> None:
        """One optimizer step with its listeners (:mod:`training.steps`); a notice agreed on by every rank ends the
        run (or, where the membership can change, lets the noticed node go) here."""
        for listener in self.listeners:
            listener.before(self, epoch, step)
        stats.loss_sum += self._run_step(step)
        self.step += 1
        decisions = [listener.after(self, epoch, step, stats) for listener in self.listeners]
        decision = decisions[-1]
        if decision == "stop":
            raise Preempted(checkpoint.save_preempted(self, epoch, step.consumed))
        if decision == "save":  # a rebalance recommendation: one coordinated checkpoint, and the job goes on
            checkpoint.save_rebalance(self, epoch, step.consumed)
        if decision in ("leave", "reform"):
            raise reform.Change(decision, (epoch, step.consumed), time.time())

    def comm_seconds(self) -> float:
        """Seconds spent averaging gradients so far (the DDP buckets' all-reduce, or the MPI data plane's)."""
        return self.timer.seconds + (self.mpi.comm_seconds if self.mpi else 0.0)

    def _run_epoch(self, epoch: int) -> dict:
        """The epoch's steps; a change of the job's membership in the middle goes on with the rest of the epoch in
        the new world (the steps re-sharded from the agreed sample on)."""
        comm_before = self.comm_seconds()
        stats = steps.EpochStats()
        while True:
            self.net.train()
            try:
                for step in steps.of_epoch(self, epoch):
                    with survivor.keep(self, epoch, step, checkpoint.state_of):  # a lost peer: the last step kept
                        self._one_step(epoch, step, stats)
                break
            except reform.Change as change:
                self.change(change)
                if self.start_epoch != epoch:  # the change agreed on the epoch's end: it is done
                    break
        elapsed = max(time.perf_counter() - stats.started, 1e-9)
        self.scheduler.step()
        comm = self.comm_seconds() - comm_before
        step_times = sorted(stats.step_times)
        count = len(step_times)
        return {"loss_sum": stats.loss_sum, "samples": stats.samples, "elapsed": elapsed, "steps": count,
                "step_time_s": round(step_times[count // 2], 5) if step_times else None,
                "comm_time_s": round(comm / max(count, 1), 5), "epoch_time_s": round(elapsed, 3)}

    def _end_epoch(self, epoch: int, local: dict) -> bool:
        """After ``epoch``'s last step: validation, the record, the snapshot, the vote (:mod:`training.epoch_end`)."""
        return epoch_end.end_epoch(self, epoch, local)

    def evaluate(self, loader: DataLoader) -> dict:
        """Loss (and accuracy) over ``loader``'s shards, summed across the ranks."""
        return epoch_end.evaluate(self, loader)

    def train(self) -> dict:
        epochs_run = 0
        if self.initial_test_loss is None:  # for loss_reduction (regression); a resumed run keeps the original
            self.initial_test_loss = self.evaluate(self.test_loader)["loss"]
        epoch = self.start_epoch
        while epoch < self.t.total_epochs:
            epochs_run += 1
            local = self._run_epoch(epoch)
            if self.start_epoch > epoch:  # a change at the epoch's end already moved past it
                epoch = self.start_epoch
                continue
            try:
                with survivor.keep_between(self, epoch + 1, checkpoint.state_of):  # a lost peer: the epoch kept
                    if self._end_epoch(epoch, local):
                        break
            except reform.Change as change:
                self.change(change)
            epoch += 1
        self.marks.done()
        test = self.evaluate(self.test_loader)
        result = {"epochs_run": epochs_run, "test_loss": test["loss"]}
        if "accuracy" in test:
            result["test_accuracy"] = test["accuracy"]
        if not self.workload.classification:
            result["loss_reduction"] = self.initial_test_loss / max(test["loss"], 1e-12)
        self.runlog.record(event="test", world_size=self.world.world_size, **result)
        if self.world.rank == 0 and self.t.metrics_dir:
            torch.save(self.model.state_dict(), Path(self.t.metrics_dir) / "final_model.pt")
        return result

    def close(self) -> None:
        """Release the metrics file and the DDP reducer (it must die before the process group does)."""
        self.runlog.close()
        self.net = self.model
