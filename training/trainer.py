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
* ``metrics.jsonl``, ``samples.jsonl``, the heartbeat -- :mod:`training.runlog`; the ledger's -- :mod:`training.marks`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import checkpoint, marks, preempt, replica, sampler, survivor, upload
from .ddp_comm import CommTimer, settle_buckets
from .config import Config
from .dist_env import World
from .mpi_plane import MpiGradients
from .runlog import RunLog, announce
from .steptimes import StepTimes
from .workloads import Workload


log = logging.getLogger("training")


class StoppedAfterEpoch(Exception):
    """``--stop-after-epoch k``: every rank stops right after epoch k (and its snapshot) on purpose."""


class Preempted(Exception):
    """A notice: every rank stopped at the same step and the snapshot of that step is written."""

    def __init__(self, report: dict):
        super().__init__(f"preempted at epoch {report['stopped_at']['epoch']} batch {report['stopped_at']['batch']}")
        self.report = report


class Trainer:
    def __init__(self, cfg: Config, world: World, workload: Workload, device: torch.device, data_plane: str):
        self.cfg, self.t = cfg, cfg.training
        self.world, self.workload, self.device = world, workload, device
        self.data_plane = data_plane
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
        self.gather, self.broadcast = world.gather, world.broadcast  # the job's object collectives
        resumed = checkpoint.restore(self)  # a snapshot's global batch replaces the fresh plan's
        log.info("%s", self.plan.describe())
        if resumed is not None and world.rank == 0:
            announce("RESUMED", resumed)
        if data_plane == "mpi":
            self.mpi = MpiGradients(self.model, world.comm, device)
            self.mpi.broadcast_parameters()
            self.net: nn.Module = self.model
        elif world.backend is not None:
            ids = [device.index] if device.type == "cuda" else None
            self.net = DDP(self.model, device_ids=ids, find_unused_parameters=self.t.find_unused_parameters)
            self.net.register_comm_hook(dist.group.WORLD, self.timer.hook)
            settle_buckets(self.net, workload.train, device)  # the same bucket layout fresh or resumed
        else:
            self.net = self.model
        self.val_loader = self._loader(workload.val)
        self.test_loader = self._loader(workload.test)
        self.runlog = RunLog(self.t.metrics_dir, world.rank, self.t.log_samples)
        self.steptimes = StepTimes(world.rank)  # every rank: the orchestrator compares them while the job trains
        self.hosts = replica.hosts(self.gather) if self.t.snapshot_dir and world.backend else []
        self.watcher = preempt.watch()  # spot notices and (with MULTINODE_GRACE) SIGTERM
        device_for_sum = device if world.backend == "nccl" else None
        self.agreement = preempt.Agreement(self.watcher, preempt.torch_all_reduce_max(device_for_sum))
        self.marks = marks.Marks(world.rank == 0)  # the ledger's steps and checkpoint stalls (training/marks.py)

    # --- plumbing -----------------------------------------------------------------------

    def _loader(self, dataset) -> DataLoader:
        """Evaluation: a strided shard per rank, without padding, so every sample is counted exactly once.
        (Training batches come from :mod:`training.sampler`.)"""
        shard = range(self.world.rank, len(dataset), self.world.world_size)
        return DataLoader(dataset, batch_size=self.t.batch_size, sampler=shard)

    # --- training ---------------------------------------------------------------------

    def _autocast(self):
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
            with self._autocast():
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

    def _steps(self, epoch: int):
        """This rank's steps of ``epoch`` (from the snapshot's sample on, in the epoch a resume starts in)."""
        consumed = self.start_consumed if epoch == self.start_epoch else 0
        order = sampler.epoch_order(len(self.workload.train), self.t.seed, epoch)
        steps = sampler.steps(order, self.plan, self.world.rank, consumed)
        # mpirun gives every rank a pty, so isatty() says nothing there: no bar under MPI.
        if self.world.rank == 0 and sys.stdout.isatty() and self.world.launch.launcher != "mpirun":
            from tqdm import tqdm

            left = sampler.steps_left(len(order), self.plan, consumed)
            steps = tqdm(steps, desc=f"epoch {epoch}", leave=False, total=left)
        return steps

    def _after_step(self, epoch: int, step: sampler.Step, ids: list | None) -> None:
        """The step's sample log (``ids``: every rank's, gathered before the step) and heartbeat; a notice agreed
        on by every rank ends the run here."""
        self.step += 1
        if ids is not None:
            self.runlog.step_samples(epoch, self.step, ids)
        self.runlog.heartbeat(self.step)
        self.marks.step(self.step)
        decision = self.agreement.check()  # the same on every rank
        if decision == "stop":
            raise Preempted(checkpoint.save_preempted(self, epoch, step.consumed))
        if decision == "save":  # a rebalance recommendation: one coordinated checkpoint, and the job goes on
            checkpoint.save_rebalance(self, epoch, step.consumed)

    def _comm_seconds(self) -> float:
        """Seconds spent averaging gradients so far (the DDP buckets' all-reduce, or the MPI data plane's)."""
        return self.timer.seconds + (self.mpi.comm_seconds if self.mpi else 0.0)

    def _run_epoch(self, epoch: int) -> dict:
        self.net.train()
        comm_before = self._comm_seconds()
        total_loss, samples, step_times = 0.0, 0, []
        start = step_start = time.perf_counter()
        for step in self._steps(epoch):
            with survivor.keep(self, epoch, step, checkpoint.state_of):  # a lost peer: the last step kept
                # The sample log's ids are gathered before the update, not after it: a peer lost once the update is
                # done (survivor.keep then keeps this step) must not leave the step out of the log.
                ids = self.gather(step.ids) if self.t.log_samples else None
                total_loss += self._run_step(step)
                time.sleep(max(0.0, self.t.pace(len(step.ids)) - (time.perf_counter() - step_start)))  # drills' pace
                samples += len(step.ids)
                now = time.perf_counter()
                step_times.append(now - step_start)
                self.steptimes.add(now - step_start, self._comm_seconds())
                step_start = now
                self._after_step(epoch, step, ids)
        elapsed = max(time.perf_counter() - start, 1e-9)
        self.scheduler.step()
        comm = self._comm_seconds() - comm_before
        step_times.sort()
        steps = len(step_times)
        return {"loss_sum": total_loss, "samples": samples, "elapsed": elapsed, "steps": steps,
                "step_time_s": round(step_times[steps // 2], 5) if step_times else None,
                "comm_time_s": round(comm / max(steps, 1), 5), "epoch_time_s": round(elapsed, 3)}

    def _end_epoch(self, epoch: int, local: dict) -> bool:
        """After ``epoch``'s last step: validation, the epoch's record, the periodic snapshot, the early-stopping
        vote; whether to stop. The validation loader draws its seed before the first collective (survivor.py)."""
        val = self.evaluate(self.val_loader)
        loss_sum, n = self.world.all_sum([local.pop("loss_sum"), local.pop("samples")], self.device)
        self.runlog.epoch({"epoch": epoch, "step": self.step, "loss": loss_sum / n if n else float("nan"),
                           "samples_per_s": round(n / local.pop("elapsed"), 1), **local, "val_loss": val["loss"],
                           "val_accuracy": val.get("accuracy"), "step_time_by_rank": self.gather(local["step_time_s"])},
                          self.t.total_epochs)
        stop = None
        if self.t.patience:  # on every rank (the same summed loss): a survivor's snapshot on any rank carries it
            self.stale = 0 if val["loss"] < self.best else self.stale + 1
            self.best = min(self.best, val["loss"])
            stop = self.stale >= self.t.patience
        saved = (epoch + 1) % self.t.save_every == 0 or epoch + 1 == self.t.total_epochs
        if saved:
            checkpoint.save(self, epoch + 1)
        if epoch == self.t.crash_after_epoch and self.world.rank == self.world.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # testing: die like a lost node, right after the snapshot
        asked = epoch == self.t.stop_after_epoch  # the same on every rank: no vote
        stop = asked or bool(self.broadcast(stop))
        if stop and not saved:
            checkpoint.save(self, epoch + 1)  # whatever save_every says: the run resumes from here
        if asked:
            raise StoppedAfterEpoch(f"stopped after epoch {epoch + 1} as asked (--stop-after-epoch {epoch})")
        if stop:
            log.info("early stopping after epoch %d: no val-loss improvement for %d epochs", epoch + 1, self.stale)
        return stop

    @torch.no_grad()
    def evaluate(self, loader: DataLoader) -> dict:
        self.net.eval()
        loss_sum, correct, n = 0.0, 0.0, 0.0
        for x, y in loader:
            x, y = x.to(self.device), y.to(self.device)
            with self._autocast():
                out = self.model(x)
            loss_sum += self.workload.loss(out.float(), y).item() * len(x)
            if self.workload.classification:
                correct += (out.argmax(1) == y).sum().item()
            n += len(x)
            self.runlog.heartbeat(self.step)
        loss_sum, correct, n = self.world.all_sum([loss_sum, correct, n], self.device)
        result = {"loss": loss_sum / n}
        if self.workload.classification:
            result["accuracy"] = correct / n
        return result

    def train(self) -> dict:
        epochs_run = 0
        if self.initial_test_loss is None:  # for loss_reduction (regression); a resumed run keeps the original
            self.initial_test_loss = self.evaluate(self.test_loader)["loss"]
        for epoch in range(self.start_epoch, self.t.total_epochs):
            epochs_run += 1
            local = self._run_epoch(epoch)
            with survivor.keep_between(self, epoch + 1, checkpoint.state_of):  # a lost peer: the whole epoch kept
                if self._end_epoch(epoch, local):
                    break
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
