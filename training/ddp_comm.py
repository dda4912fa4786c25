"""DDP's gradient buckets: a hook timing each bucket's allreduce (the trainer's comm time), and
:func:`settle_buckets`, which makes every training step of a run -- fresh or resumed -- use the same layout.

DDP lays its buckets out in parameter order, then, after the first synchronized backward, rebuilds them in the
order the gradients became ready (for our CNN: a layer's weight before its bias). With three or more ranks the
summation order of an element depends on where it lies in the bucket (ring allreduce chunks), so a run resumed
mid-way -- whose first step would use the initial layout while the uninterrupted run used the rebuilt one --
ends with different low bits. With two ranks a+b is exact either way.
"""

from __future__ import annotations

import time

import torch


class CommTimer:
    """DDP communication hook: plain allreduce-average, timing each bucket until it completes."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        start = time.perf_counter()
        fut = default_hooks.allreduce_hook(state, bucket)

        def done(f):
            self.seconds += time.perf_counter() - start
            return f.value()

        return fut.then(done)


def settle_buckets(net, dataset, device: torch.device) -> None:
    """One forward/backward of zero loss on two training samples, so DDP rebuilds its buckets before the first
    real step. Touches no weight (the gradients are zeros and dropped, no optimizer step) and no random stream
    (the RNG states are put back)."""
    from .snapshot import rng_state, set_rng_state

    saved = rng_state()
    x = torch.stack([dataset[i][0] for i in range(2)]).to(device)
    (net(x).float().sum() * 0.0).backward()
    for param in net.parameters():
        param.grad = None
    set_rng_state(saved)
