"""One epoch's optimizer steps, each wrapped by the listeners that ride along with it.

The trainer's step itself is forward, backward, the gradient average and the update (:meth:`Trainer._run_step`);
everything else a step carries is a listener here, each one idea, called in order before and after every step:

* :class:`Samples` -- the step's sample ids, every rank's, gathered BEFORE the update (a peer lost once the update
  is done must not leave the kept step out of the log) and written by rank 0 after it (``samples.jsonl``);
* :class:`Pacing` -- a drill's pace: the step lasts at least ``--min-step-seconds``, or ``--min-sample-seconds``
  per sample of this rank's share (the rest asleep), as a bigger model's would;
* :class:`Times` -- the step's seconds and communication for the slow-rank reader (``STEPTIMES``) and the epoch's
  record;
* :class:`Beat` -- the heartbeat file and the ledger's step marks;
* :class:`Agree` -- the notice agreement (:class:`training.notice.Agreement`), the last: its decision, the same
  on every rank, is the step's outcome (``"stop"``, ``"save"``, ``"leave"``, ``"reform"`` or None).

Around every step, :func:`training.survivor.keep` keeps the last completed step when a peer is lost.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from . import sampler


@dataclass
class EpochStats:
    """What an epoch's steps add up to on this rank."""

    loss_sum: float = 0.0
    samples: int = 0
    step_times: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)


class Listener:
    """A concern of every step: ``before`` it (after the previous one), ``after`` it (its update done)."""

    def before(self, trainer, epoch: int, step) -> None:
        pass

    def after(self, trainer, epoch: int, step, stats: EpochStats) -> str | None:
        return None


class Samples(Listener):
    def __init__(self) -> None:
        self.ids: list | None = None

    def before(self, trainer, epoch, step):
        self.ids = trainer.gather(step.ids) if trainer.t.log_samples else None

    def after(self, trainer, epoch, step, stats):
        self.flush(trainer, epoch)

    def flush(self, trainer, epoch: int) -> None:
        """The gathered ids as the step ``trainer.step``'s (also for a step this rank adopted from a peer that
        finished it: the ids were gathered before the update, on every rank)."""
        if self.ids is not None:
            trainer.runlog.step_samples(epoch, trainer.step, self.ids)
        self.ids = None


class Pacing(Listener):
    def __init__(self) -> None:
        self.began = time.perf_counter()

    def before(self, trainer, epoch, step):
        self.began = time.perf_counter()

    def after(self, trainer, epoch, step, stats):
        time.sleep(max(0.0, trainer.t.pace(len(step.ids)) - (time.perf_counter() - self.began)))  # drills' pace


class Times(Listener):
    def __init__(self) -> None:
        self.began = time.perf_counter()

    def before(self, trainer, epoch, step):
        self.began = time.perf_counter()

    def after(self, trainer, epoch, step, stats):
        now = time.perf_counter()
        stats.samples += len(step.ids)
        stats.step_times.append(now - self.began)
        trainer.steptimes.add(now - self.began, trainer.comm_seconds(), trainer.step)


class Beat(Listener):
    def after(self, trainer, epoch, step, stats):
        trainer.runlog.heartbeat(trainer.step)
        trainer.marks.step(trainer.step)


class Agree(Listener):
    def after(self, trainer, epoch, step, stats):
        return trainer.agreement.check()  # the same on every rank


def listeners() -> list[Listener]:
    """A step's listeners, in the order they run (module doc); Pacing before Times: the pace is the step's."""
    return [Samples(), Pacing(), Times(), Beat(), Agree()]


def of_epoch(trainer, epoch: int):
    """This rank's steps of ``epoch`` (from the agreed sample on, in the epoch a resume or a membership change
    starts in), re-sharded over the world the ranks are in; a progress bar for rank 0 on a terminal."""
    consumed = trainer.start_consumed if epoch == trainer.start_epoch else 0
    order = sampler.epoch_order(len(trainer.workload.train), trainer.t.seed, epoch)
    plan_steps = sampler.steps(order, trainer.plan, trainer.world.rank, consumed)
    # mpirun gives every rank a pty, so isatty() says nothing there: no bar under MPI.
    if trainer.world.rank == 0 and sys.stdout.isatty() and trainer.world.launch.launcher != "mpirun":
        from tqdm import tqdm

        left = sampler.steps_left(len(order), trainer.plan, consumed)
        plan_steps = tqdm(plan_steps, desc=f"epoch {epoch}", leave=False, total=left)
    return plan_steps

