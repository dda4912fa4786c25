"""The resumable, re-shardable batch order (training/sampler.py): pure, no process group."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from training import sampler
from training.sampler import BatchPlan


def rank_steps(order, plan, consumed=0):
    """Every rank's steps, side by side: [(rank 0's step, rank 1's step, ...), ...]."""
    return list(zip(*(sampler.steps(order, plan, r, consumed) for r in range(plan.world_size)), strict=True))


def train_then_resize(n, before, after, stop_after_steps, batch_size=8, grad_accum=1, seed=0, epoch=3):
    """The sample ids trained in one epoch: ``stop_after_steps`` steps on ``before`` ranks, the rest on ``after``
    ranks with the same global batch. Checks every step's shape on the way."""
    order = sampler.epoch_order(n, seed, epoch)
    first = BatchPlan.fresh(batch_size, grad_accum, before)
    seen, consumed = [], 0
    for step in rank_steps(order, first)[:stop_after_steps]:
        seen += [i for s in step for i in s.ids]
        consumed = step[0].consumed
    second = BatchPlan(first.global_batch, after, batch_size)
    for step in rank_steps(order, second, consumed):
        assert len({len(s.micro_batches) for s in step}) == 1  # every rank the same number of micro-batches
        assert all(len(m) <= second.micro_batch for s in step for m in s.micro_batches)
        assert sum(len(s.ids) for s in step) == step[0].size <= first.global_batch
        seen += [i for s in step for i in s.ids]
    return seen


@pytest.mark.parametrize("before, after", [(3, 2), (4, 3), (2, 3)])
@pytest.mark.parametrize("n", [1259, 960, 7])
def test_a_resize_mid_epoch_trains_every_sample_exactly_once(n, before, after):
    for stop in (0, 1, 2, 5):
        seen = train_then_resize(n, before, after, stop)
        assert sorted(seen) == list(range(n)), (stop, [i for i, c in Counter(seen).items() if c > 1])


def test_a_resize_keeps_the_global_batch_and_recomputes_the_accumulation():
    plan = BatchPlan.fresh(32, 1, 3)
    assert plan.describe() == "global batch 96 = 3 ranks x 32 samples (1 micro-batches of up to 32)"
    assert BatchPlan(96, 2, 32).describe() == "global batch 96 = 2 ranks x 48 samples (2 micro-batches of up to 24)"
    assert BatchPlan(96, 4, 32).describe() == "global batch 96 = 4 ranks x 24 samples (1 micro-batches of up to 24)"
    odd = BatchPlan(100, 3, 16)
    assert (odd.share, odd.accum, odd.micro_batch) == (34, 3, 12)
    step = [s for s in (next(sampler.steps(list(range(1000)), odd, r)) for r in range(3))]
    assert [[len(m) for m in s.micro_batches] for s in step] == [[12, 11, 11], [11, 11, 11], [11, 11, 11]]


@pytest.mark.parametrize("batch_size, grad_accum, world", [(32, 1, 2), (8, 3, 3), (5, 2, 1)])
def test_even_steps_are_distributed_samplers_batches(batch_size, grad_accum, world):
    """Where DistributedSampler needs no padding and the epoch is whole steps, the order is its order exactly
    (what keeps an even run's batches what they were)."""
    n = batch_size * grad_accum * world * 7
    data = torch.arange(n)
    plan = BatchPlan.fresh(batch_size, grad_accum, world)
    for rank in range(world):
        dist_sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=5)
        dist_sampler.set_epoch(2)
        theirs = [b.tolist() for b in DataLoader(data, batch_size=batch_size, sampler=dist_sampler)]
        ours = [m for s in sampler.steps(sampler.epoch_order(n, 5, 2), plan, rank) for m in s.micro_batches]
        assert ours == theirs


def test_the_last_step_is_smaller_and_a_rank_may_have_nothing():
    plan = BatchPlan(12, 3, 4)
    last = [list(sampler.steps(list(range(14)), plan, r))[-1] for r in range(3)]
    assert [s.size for s in last] == [2, 2, 2] and [s.consumed for s in last] == [14] * 3
    assert [s.micro_batches for s in last] == [[[12]], [[13]], [[]]]
    assert sampler.steps_left(14, plan) == 2 and sampler.steps_left(14, plan, 12) == 1
    assert sampler.steps_left(14, plan, 14) == 0 and list(sampler.steps(list(range(14)), plan, 0, 14)) == []


def test_loss_weights_give_the_mean_over_the_step():
    assert sampler.loss_divisor(32, 2, 64) == 1.0  # one micro-batch per rank: the mean as it is
    assert sampler.loss_divisor(32, 2, 192) == 3.0  # even accumulation: mean / grad_accum
    # uneven shares 34/33/33 of a 100-sample step: the weights (n x W / T) average to the step's mean
    weights = [n * 3 / 100 for n in (34, 33, 33)]
    assert [1 / sampler.loss_divisor(n, 3, 100) for n in (34, 33, 33)] == pytest.approx(weights)
    assert sum(weights) / 3 == pytest.approx(1.0)


def test_bad_plans_and_ranks_are_refused():
    with pytest.raises(ValueError, match="must all be at least 1"):
        BatchPlan(0, 2, 32)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        next(sampler.steps([1, 2, 3], BatchPlan(2, 2, 1), 2))
