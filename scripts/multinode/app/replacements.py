"""Replacements under way, and whether recovery waits for one or goes on without it at once.

A replacement is asked once per node and runs on a thread of its own (:class:`Replacements`): recovery waits for it
as long as :func:`wait_seconds` says, then goes on with the nodes it has if it is not ready; the replacement keeps
going meanwhile and, when it is done, reports to the attempt that is running then (its loop's queue:
:class:`~multinode.core.events.ReplacementReady` or :class:`~multinode.core.events.ReplacementRefused`), where
growing back (:mod:`multinode.app.growback`) takes it -- the provider is never asked a second time for a node whose
replacement is still under way. Any error of a replacement (the provider's own, boto3's, a waiter giving up) is a
refusal in one line: the run goes on with the nodes it has.

**Wait or shrink.** Going on without the node costs one more coordinated checkpoint and one more restart of the job
when the node is back (growing back); waiting costs the replacement's own time, with every node idle. So recovery
waits only when the provider says the replacement comes sooner than that restart: the provider's estimate
(:meth:`~multinode.providers.base.Provider.replacement_estimate`: locally about a second, plus
``MULTINODE_REPLACE_DELAY``; on EC2 the median of the cluster's own launches) against the run's own measured
restart, the seconds from the run's start to its first job's launch (pre-flight, code sync and setup, launch: what a
grow-back's attempt repeats, the sync then incremental; not counted: the job's own start to its first step). A
provider that cannot say (hosts: None) is waited for up to RECOVER_WAIT, as before.

**Beside a noticed node** (``ask(name, beside=True)``, :mod:`multinode.app.stays`): the provider is given a
``retire`` call for the moment its new machine is ready to take the old one's place; it puts a
:class:`~multinode.core.events.Retire` on the listening attempt's queue and waits -- at most
:data:`RETIRE_PATIENCE` s -- until the run lets the node go: its ranks ended after the run told them to leave
(:meth:`Replacements.retired`), or the run waits for the replacement between attempts (:meth:`Replacements.wait`:
a noticed head, whose ranks stopped every rank at its deadline, after the attempt's sweep), or the run ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from multinode.core.errors import CapacityRefused, MultinodeError
from multinode.core.events import Events, ReplacementReady, ReplacementRefused, Retire
from multinode.core.inventory import Inventory


FINISH_PATIENCE = 900.0  # seconds a run's end waits for its replacements under way (an EC2 launch, bootstrap)
# Seconds a replacement launched beside a noticed node waits for the run to let that node go: the notice's two
# minutes (its ranks leave by themselves before then: training/notice.py's STAY_MARGIN) and the leave itself.
RETIRE_PATIENCE = 150.0
# Seconds the run waits, at least, for a replacement already launched beside a noticed node once it lets the node
# go: the old machine ended and the new one made (a local node: about a second) -- never worth a shrink and a grow-back.
SWAP_PATIENCE = 60.0


def wait_seconds(estimate: float | None, restart: float | None, recover_wait: float) -> float:
    """How long recovery waits for a replacement before going on without it (see the module doc): RECOVER_WAIT when
    the provider cannot say how long it takes or the restart was not measured, or when the replacement comes within
    the restart's seconds; 0 -- go on at once -- when it takes longer. Pure."""
    if estimate is None or restart is None or estimate <= restart:
        return recover_wait
    return 0.0


@dataclass(frozen=True)
class Replaced:
    """A replacement that is done: the cluster with the new node and when it was ready, or why there is none."""

    node: str
    inventory: Inventory | None
    at: float
    refused: str | None = None  # one line: no capacity, or the error that ended the replacement

    def event(self) -> ReplacementReady | ReplacementRefused:
        if self.refused is not None:
            return ReplacementRefused(self.node, self.refused)
        return ReplacementReady(self.node, self.inventory, self.at)


class Replacements:
    """One replacement per node at a time, each ``replace(name, retire) -> Inventory`` on a daemon thread
    (``retire``: None, or the call before the old machine ends, for a replacement beside a noticed node)."""

    def __init__(self, replace: Callable[[str, Callable[[], None] | None], Inventory]) -> None:
        self.replace = replace
        self._retiring: dict[str, threading.Event] = {}  # beside a noticed node: set when the run lets it go
        self._under_way: dict[str, threading.Thread] = {}
        self._done: dict[str, Replaced] = {}  # done, not yet taken
        self._listener: Events | None = None
        self._lock = threading.Lock()

    def ask(self, name: str, beside: bool = False) -> None:
        """Start ``name``'s replacement unless one is under way (or done and not yet taken); ``beside``: launched
        while the noticed node still trains (module doc)."""
        with self._lock:
            if name in self._under_way or name in self._done:
                return
            worker = threading.Thread(target=self._run, args=(name, beside), name=f"mn-replace-{name}", daemon=True)
            self._under_way[name] = worker
        worker.start()

    def under_way(self, name: str) -> bool:
        with self._lock:
            return name in self._under_way

    def launched(self, name: str) -> bool:
        """Whether ``name``'s replacement is launched beside it and waits for the run to let the node go."""
        with self._lock:
            return name in self._retiring

    def _run(self, name: str, beside: bool = False) -> None:
        try:
            retire = (lambda ready: self._retire(name, ready)) if beside else None
            done = Replaced(name, self.replace(name, retire), time.time())
        except CapacityRefused as err:
            done = Replaced(name, None, time.time(), str(err))
        except MultinodeError as err:
            done = Replaced(name, None, time.time(), f"the replacement failed: {err}")
        except Exception as err:  # noqa: BLE001 -- boto3's own errors too: a refusal in one line, never a dead thread
            done = Replaced(name, None, time.time(),
                            f"the replacement failed: {type(err).__name__}: {' '.join(str(err).split())}")
        with self._lock:
            del self._under_way[name]
            listener = self._listener
            if listener is None:
                self._done[name] = done
        if listener is not None:
            listener.put(done.event())

    def _retire(self, name: str, ready: bool = True) -> None:
        """The provider's call before it ends ``name``'s old machine (``ready``: its new one launched beside it): a
        Retire on the listening attempt's queue, then wait until the run lets the node go (module doc); at once
        when no attempt listens."""
        with self._lock:
            listener = self._listener
            if listener is None:
                return
            let_go = self._retiring.setdefault(name, threading.Event())
        listener.put(Retire(name, ready))
        let_go.wait(RETIRE_PATIENCE)
        with self._lock:
            self._retiring.pop(name, None)

    def retired(self, name: str) -> bool:
        """The run let ``name`` go (its ranks ended): its replacement ends the old machine now. True when one was
        waiting for that (launched beside the node)."""
        with self._lock:
            let_go = self._retiring.get(name)
        if let_go is not None:
            let_go.set()
        return let_go is not None

    def wait(self, name: str, seconds: float) -> Replaced | None:
        """``name``'s replacement once it is done within ``seconds`` (taken: a refusal ends the ask), or None while
        it is still under way (it goes on, and reports to the attempt running when it is done). Nothing keeps the
        old node once the run waits for its replacement: one launched beside it goes on, waited for SWAP_PATIENCE s
        at least (only the swap is left)."""
        launched = self.retired(name)
        with self._lock:
            worker = self._under_way.get(name)
        if worker is not None:
            worker.join(max(seconds, SWAP_PATIENCE) if launched else seconds)
        with self._lock:
            return self._done.pop(name, None)

    def finish(self, say: Callable[[str], None], patience: float = FINISH_PATIENCE) -> None:
        """At the run's end: the replacements still under way are waited for (at most ``patience`` seconds), so the
        cluster is left whole -- a replacement ends the old machine before it makes the new one, and one cut short
        would leave the cluster a node short."""
        with self._lock:
            under_way = dict(self._under_way)
            for let_go in self._retiring.values():  # the run is over: nothing keeps a noticed node
                let_go.set()
        if under_way:
            say(f"waiting for the replacement of {', '.join(under_way)} (under way): the cluster is left whole")
        end = time.monotonic() + patience
        for worker in under_way.values():
            worker.join(max(0.0, end - time.monotonic()))

    def listen(self, events: Events | None) -> None:
        """From now on a replacement that is done reports to ``events`` (an attempt's loop); one done while nobody
        listened reports there at once. None: nobody listens (between attempts)."""
        with self._lock:
            self._listener = events
            done = list(self._done.values()) if events is not None else []
            if events is not None:
                self._done.clear()
        for replaced in done:
            events.put(replaced.event())
