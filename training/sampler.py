"""The training batch order: resumable at any optimizer step and re-shardable over any number of ranks.

An epoch's order is DistributedSampler's global permutation (``torch.randperm`` with a generator seeded
``seed + epoch``). The epoch is cut into optimizer steps of ``G`` global samples (the global batch): step ``j``
trains ``perm[j*G:(j+1)*G]``, rank ``r`` of ``W`` takes that slice's ``[r::W]``, and each rank cuts its share into
the step's micro-batches (gradient accumulation), consecutive, sizes differing by at most one, every rank
the same number of them. With ``G = A x B x W`` this is exactly what DistributedSampler with a DataLoader of
batch ``B`` and ``A`` accumulation steps gives; unlike it, there is no padding: every sample index is trained
exactly once per epoch, and the last step may be smaller (its shares may differ by one, a rank's micro-batch
may be empty). The trainer weights each micro-batch's mean loss by its share of the step
(:func:`loss_divisor`), so the gradient is the mean over the step's samples whatever ``W`` is.

A run that stopped after ``consumed`` samples of an epoch resumes with ``perm[consumed:]``, on any world size:
the same ``G`` keeps the same steps, so ``W`` ranks then ``W'`` ranks see every index once, and the same
``W`` continues bitwise. Pure: no process group, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class BatchPlan:
    """A global batch over ``world_size`` ranks with micro-batches of at most ``batch_size`` samples."""

    global_batch: int  # G: samples per optimizer step, over all ranks
    world_size: int  # W
    batch_size: int  # the largest micro-batch a rank may take (--batch-size)

    def __post_init__(self):
        if min(self.global_batch, self.world_size, self.batch_size) < 1:
            raise ValueError(f"global batch {self.global_batch}, world size {self.world_size} and batch size "
                             f"{self.batch_size} must all be at least 1")

    @classmethod
    def fresh(cls, batch_size: int, grad_accum: int, world_size: int) -> BatchPlan:
        """A new run's plan: ``G = batch_size x grad_accum x world_size``."""
        return cls(batch_size * grad_accum * world_size, world_size, batch_size)

    @property
    def share(self) -> int:
        """S: the most samples one rank takes in a full step."""
        return _ceil_div(self.global_batch, self.world_size)

    @property
    def accum(self) -> int:
        """A: micro-batches per full step."""
        return _ceil_div(self.share, self.batch_size)

    @property
    def micro_batch(self) -> int:
        """M: the largest micro-batch of a full step (<= batch_size)."""
        return _ceil_div(self.share, self.accum)

    def describe(self) -> str:
        return (f"global batch {self.global_batch} = {self.world_size} ranks x {self.share} samples "
                f"({self.accum} micro-batches of up to {self.micro_batch})")

    def micro_batches_of(self, step_size: int) -> int:
        """How many micro-batches every rank runs in a step of ``step_size`` global samples (A for a full step)."""
        return max(1, _ceil_div(_ceil_div(step_size, self.world_size), self.micro_batch))


def epoch_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The epoch's global permutation: DistributedSampler's with ``shuffle=True``."""
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def split(share: list[int], parts: int) -> list[list[int]]:
    """``share`` cut into ``parts`` consecutive pieces whose sizes differ by at most one (larger first)."""
    size, extra = divmod(len(share), parts)
    pieces, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        pieces.append(share[start:end])
        start = end
    return pieces


@dataclass(frozen=True)
class Step:
    """One optimizer step as one rank sees it."""

    consumed: int  # global samples of the epoch trained once this step is done
    size: int  # global samples in this step (G, or fewer for the epoch's last)
    micro_batches: list[list[int]]  # this rank's sample indices, one list per micro-batch (some may be empty)

    @property
    def ids(self) -> list[int]:
        return [i for micro in self.micro_batches for i in micro]


def steps(order: list[int], plan: BatchPlan, rank: int, consumed: int = 0) -> Iterator[Step]:
    """Rank ``rank``'s steps of the epoch whose order is ``order``, from ``consumed`` samples on."""
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank {rank} is not in a world of {plan.world_size}")
    start = consumed
    while start < len(order):
        chunk = order[start:start + plan.global_batch]
        start += len(chunk)
        parts = plan.micro_batches_of(len(chunk))
        yield Step(start, len(chunk), split(chunk[rank::plan.world_size], parts))


def steps_left(num_samples: int, plan: BatchPlan, consumed: int = 0) -> int:
    """Optimizer steps from ``consumed`` to the end of the epoch."""
    return _ceil_div(max(num_samples - consumed, 0), plan.global_batch)


def loss_divisor(samples: int, world_size: int, step_size: int) -> float:
    """What a micro-batch's mean loss is divided by before the gradient average (DDP's or the MPI plane's,
    both a division by ``world_size``), so the step's gradient is the mean over its ``step_size`` samples:
    the weight is ``samples x world_size / step_size``. An even step gives the accumulation count ``A``
    exactly (today's ``mean / grad_accum``, bitwise)."""
    return step_size / (samples * world_size)
