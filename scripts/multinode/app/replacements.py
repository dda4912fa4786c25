"""Replacements under way, and whether recovery waits for one or goes on without it at once.

A replacement is asked once per node and runs on a thread of its own (:class:`Replacements`): recovery waits for it
as long as :func:`wait_seconds` says, then goes on with the nodes it has if it is not ready; the replacement keeps
going meanwhile, and growing back (:mod:`multinode.app.growback`) takes its result when it is ready -- it never asks
the provider a second time for a node whose replacement is still under way.

**Wait or shrink.** Going on without the node costs one more coordinated checkpoint and one more restart of the job
when the node is back (growing back); waiting costs the replacement's own time, with every node idle. So recovery
waits only when the provider says the replacement comes sooner than that restart: the provider's estimate
(:meth:`~multinode.providers.base.Provider.replacement_estimate`: locally about a second, plus
``MULTINODE_REPLACE_DELAY``; on EC2 the median of the cluster's own launches) against the run's own measured
restart, the seconds from the run's start to its first job's launch (pre-flight, code sync and setup, launch: what a
grow-back's attempt repeats, the sync then incremental; not counted: the job's own start to its first step). A
provider that cannot say (hosts: None) is waited for up to RECOVER_WAIT, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from multinode.core.errors import CapacityRefused, MultinodeError
from multinode.core.inventory import Inventory


class StillUnderWay(MultinodeError):
    """The node's replacement was asked and is not ready yet."""


def wait_seconds(estimate: float | None, restart: float | None, recover_wait: float) -> float:
    """How long recovery waits for a replacement before going on without it (see the module doc): RECOVER_WAIT when
    the provider cannot say how long it takes or the restart was not measured, or when the replacement comes within
    the restart's seconds; 0 -- go on at once -- when it takes longer. Pure."""
    if estimate is None or restart is None or estimate <= restart:
        return recover_wait
    return 0.0


class Replacements:
    """One replacement per node at a time, each ``replace(name) -> Inventory`` on a daemon thread."""

    def __init__(self, replace: Callable[[str], Inventory]) -> None:
        self.replace = replace
        self._under_way: dict[str, tuple[threading.Thread, dict]] = {}

    def ask(self, name: str) -> None:
        """Start ``name``'s replacement unless one is under way."""
        if name in self._under_way:
            return
        box: dict = {}

        def run() -> None:
            try:
                box["inventory"] = self.replace(name)
            except CapacityRefused as err:
                box["refused"] = str(err)
            except MultinodeError as err:
                box["refused"] = f"the replacement failed: {err}"
            except Exception as err:  # noqa: BLE001 -- boto3's own errors too: a refusal, never a dead thread
                box["refused"] = f"the replacement failed: {type(err).__name__}: {' '.join(str(err).split())}"
            box["done_at"] = time.time()

        worker = threading.Thread(target=run, name=f"mn-replace-{name}", daemon=True)
        self._under_way[name] = (worker, box)
        worker.start()

    def wait(self, name: str, seconds: float) -> tuple[Inventory | None, str, float | None]:
        """(the new inventory, "", when it was ready) once ``name``'s replacement is done within ``seconds``; else
        (None, why not, None) -- a refusal ends the ask, a replacement not ready yet stays under way."""
        worker, box = self._under_way[name]
        worker.join(seconds)
        if worker.is_alive():
            return None, "still under way", None
        del self._under_way[name]
        if "refused" in box:
            return None, box["refused"], None
        return box["inventory"], "", box["done_at"]

    def take(self, name: str, patience: float = 0.0) -> tuple[Inventory, float]:
        """For growing back: ``name``'s replacement (asked now if none is under way) if it is ready within
        ``patience`` seconds, and when it was; StillUnderWay while it is not (ask again later), CapacityRefused when it
        was refused (the next ask starts a new one)."""
        self.ask(name)
        inventory, why, done_at = self.wait(name, patience)
        if inventory is not None:
            return inventory, done_at
        if why == "still under way":
            raise StillUnderWay(f"the replacement of {name} is still under way")
        raise CapacityRefused(why)
