"""The trainer as the loop a membership change happens in (:class:`training.reform.Host`): what a change needs of
it -- how to give up the step it met, what a rank that lacks the state receives and how it takes it, how the trainer
goes on in the new world -- and the change itself, with its fallback.

The fallback: when the run's new membership does not come within the reform timeout, the first rank of each node
writes the survivor snapshot of the last completed step (:mod:`training.survivor`) and the rank fails, so the run's
restart path resumes every process from it.
"""

from __future__ import annotations

from . import checkpoint, membership, reform, survivor
from .snapshot import set_rng_state


class ChangeHost:
    """Mixed into :class:`training.trainer.Trainer` (its attributes are the trainer's)."""

    def change(self, change: reform.Change) -> None:
        """The membership changes (:mod:`training.reform`); when the run's new membership does not come, the
        survivor snapshot of the last completed step is written and the rank fails: the restart path takes over."""
        try:
            reform.change(self, change)
        except membership.NoNewMembership as err:
            if self.t.snapshot_dir and self.world.local_rank == 0:
                survivor.save(self, checkpoint.state_of(self, *change.position), None,
                              RuntimeError(change.error or str(err)))
            raise RuntimeError(f"{err}: the restart path takes over") from err

    @property
    def timeout(self) -> float:
        return self.cfg.distributed.timeout

    def paused(self, what: reform.Change) -> None:
        if what.rng is not None:
            set_rng_state(what.rng)
        self.optimizer.zero_grad(set_to_none=True)

    def state_of(self, position: tuple[int, int]) -> dict:
        return checkpoint.state_of(self, *position)

    def apply(self, state: dict) -> None:
        checkpoint.apply(self, state)

    def rejoined(self, position: tuple[int, int], adopted: bool) -> None:
        self.start_epoch, self.start_consumed = position
        if self.world.rank == 0 and adopted:
            self.listeners[0].flush(self, position[0])  # the adopted step's ids, gathered before it
        self.join_world()
