"""DDP communication hook that times each gradient bucket's allreduce (the trainer's comm time)."""

from __future__ import annotations

import time


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
