"""Growing back: a run that went on with fewer nodes asks again for the missing ones, and when they are ready it
gives the ranks a notice, so they take one coordinated checkpoint and stop (exit 75); the recovery then resumes
on the whole cluster from that checkpoint (:mod:`multinode.app.recover`). The global batch stays what it was.

One thread per run on fewer nodes, asking every ``interval`` seconds (RECOVER_WAIT); it never stops the job
itself except through the notice, and it is stopped when the run ends."""

from __future__ import annotations

import threading
from collections.abc import Callable

from multinode.core.errors import MultinodeError
from multinode.core.inventory import Inventory


class GrowBack:
    """Ask ``replace(name) -> Inventory`` for each missing node until all are back, then ``notify()`` (True once it
    reached the job; a job not started yet is notified at the next interval)."""

    def __init__(self, missing: list[str], replace: Callable[[str], Inventory], notify: Callable[[], bool],
                 interval: float, say: Callable[[str], None]) -> None:
        self.missing, self.replace, self.notify = list(missing), replace, notify
        self.interval, self.say = interval, say
        self.cluster: Inventory | None = None  # the inventory once every missing node is back
        self.notified = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mn-grow-back", daemon=True)

    def __enter__(self) -> "GrowBack":
        if self.missing:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.missing:
                self._ask(self.missing[0])
            if not self.missing:
                self.say("every node is back: the ranks take a checkpoint and the run resumes on the whole cluster")
                if self.notify():
                    self.notified = True
                    return

    def _ask(self, name: str) -> None:
        try:
            self.cluster = self.replace(name)
        except MultinodeError as err:  # CapacityRefused included
            self.say(f"{name}: still no replacement ({err}); asking again in {self.interval:.0f} s")
            return
        self.missing.pop(0)
        self.say(f"{name} is back")
