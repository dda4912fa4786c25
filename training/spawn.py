"""``train.py --spawn N``: N ranks on this machine with ``torch.multiprocessing.spawn``, no launcher.

What ``torchrun --standalone --nproc-per-node=N`` does, in one process tree: the parent hosts the
rendezvous store (a torch ``TCPStore`` on 127.0.0.1, on a port the kernel picks, so there is no
race for a free port and nothing listens beyond loopback), then starts N children; child ``i`` is
rank ``i`` (local rank ``i``) and joins the store as a client, as torchrun's workers join their
agent's store. Every rank then runs the entry it is given (``train.py`` passes its own ``main``), the
same as under any other launcher, so the same seed gives the same weights as torchrun's run.

Exit code: 0 when every rank exited 0; otherwise the first failed rank's code (1 for an uncaught
exception), after ``mp.spawn`` has stopped the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta

LOOPBACK = "127.0.0.1"


def _rank_main(index: int, entry: Callable, nprocs: int, port: int, argv: list[str]) -> None:
    """One child: rank ``index`` of ``nprocs``; its exit code is ``entry``'s."""
    from . import dist_env

    code = entry(argv, launch=dist_env.Launch("spawn", index, nprocs, index, LOOPBACK, port))
    sys.stdout.flush()
    if code:
        sys.exit(code)


def run(entry: Callable, argv: list[str], nprocs: int, timeout: float) -> int:
    """Host the store, start ``nprocs`` ranks, each running ``entry(argv, launch=<its Launch>)`` (a function
    the children can import by name: pickled, not copied), wait for all of them; the job's exit code."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore(LOOPBACK, 0, nprocs, is_master=True, timeout=timedelta(seconds=timeout),
                          wait_for_workers=False)
    try:
        mp.spawn(_rank_main, args=(entry, nprocs, store.port, argv), nprocs=nprocs, join=True)
    except mp.ProcessExitedException as err:
        print(f"train.py: rank {err.error_index} exited with code {err.exit_code}", file=sys.stderr)
        return err.exit_code if err.exit_code and err.exit_code > 0 else 1
    except mp.ProcessRaisedException as err:
        print(f"train.py: rank {err.error_index} failed:\n{err}", file=sys.stderr)
        return 1
    finally:
        del store
    return 0
