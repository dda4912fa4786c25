"""Growing back: an attempt that went on with fewer nodes asks again for the missing ones, and when they are ready
it gives the ranks the backend's notice (:meth:`multinode.backends.base.Backend.notice`), so they take one
coordinated checkpoint and stop (exit 75); the run's next attempt then resumes on the whole cluster from that
checkpoint (:mod:`multinode.app.recover`). The global batch stays what it was.

One thread per attempt on fewer nodes, asking every ``interval`` seconds (RECOVER_WAIT), over the run's own
connections; it never stops the job itself except through the notice, and it is stopped when the attempt ends. Our trainer takes the notice only once it
trains (its watcher starts with the trainer; a SIGTERM while it starts would end it as a failure), so the notice
waits for a heartbeat the ranks wrote in this attempt (:func:`job_trains`); a user script runs behind
``training.guard``, which takes a SIGTERM from its first instant."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from multinode.backends.base import RunContext
from multinode.core.errors import MultinodeError
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.trainer import channel


class GrowBack:
    """Ask ``replace(name) -> Inventory`` for each missing node until all are back, then ``notify()`` (True once it
    reached the job; a job not started or not training yet is notified at a later interval)."""

    def __init__(self, missing: list[str], replace: Callable[[str], Inventory], notify: Callable[[], bool],
                 interval: float, say: Callable[[str], None]) -> None:
        self.missing, self.replace, self.notify = list(missing), replace, notify
        self.interval, self.say = interval, say
        self.cluster: Inventory | None = None  # the inventory once every missing node is back
        self.notified = False
        self._refused: set[str] = set()  # nodes whose refusal was told once (the asks go on quietly)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mn-grow-back", daemon=True)

    @classmethod
    def idle(cls) -> "GrowBack":
        """Nothing missing: nothing to ask, no notice."""
        return cls([], lambda name: None, lambda: False, 0.0, lambda message: None)

    def __enter__(self) -> "GrowBack":
        if self.missing:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        told = False
        while not self._stop.wait(self.interval):
            if self.missing:
                self._ask(self.missing[0])
            if not self.missing:
                if not told:
                    self.say("every node is back: the ranks take a checkpoint and the run resumes on the whole "
                             "cluster")
                    told = True
                if self.notify():
                    self.notified = True
                    return

    def _ask(self, name: str) -> None:
        try:
            self.cluster = self.replace(name)
        except MultinodeError as err:  # CapacityRefused included
            if name not in self._refused:
                self._refused.add(name)
                self.say(f"{name}: still no replacement ({err}); asking again every {self.interval:.0f} s")
            return
        self.missing.pop(0)
        self.say(f"{name} is back")


def fresh_heartbeat(stat_outputs: Iterable[str], since: float) -> bool:
    """True when a heartbeat was written after ``since`` (Unix seconds): ``stat_outputs`` hold the heartbeat files'
    modification times in whole seconds (``stat -c %Y``). A file of the same second as ``since`` counts as older
    (the next heartbeat, a second later at most, settles it)."""
    return any(tok.isdigit() and int(tok) > int(since) for text in stat_outputs for tok in text.split())


def job_trains(ctx: RunContext, since: float) -> bool:
    """Whether the job can take the notice now: a user script always (behind training.guard); our trainer once a
    rank wrote a heartbeat after ``since`` (a step is a collective, so every rank's watcher runs by then)."""
    if ctx.spec.script is not None:
        return True
    commands = {n.name: f"stat -c %Y {channel.heartbeat_glob(node_run_dir(ctx.inv, n.name, ctx.spec.run_id))} "
                        f"2>/dev/null; true" for n in ctx.inv.nodes}
    answers = ctx.runner.run_each(commands, timeout=10)
    return fresh_heartbeat((res.stdout for res in answers.values() if res.ok), since)
