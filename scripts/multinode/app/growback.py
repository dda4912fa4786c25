"""Growing back: an attempt that went on with fewer nodes takes the missing ones back as their replacements come
ready, and once all are back the run gives the ranks the backend's notice, so they take one coordinated checkpoint
and stop (exit 75); the run's next attempt then resumes on the whole cluster from that checkpoint
(:mod:`multinode.app.recover`). The global batch stays what it was.

A branch of the attempt's loop (:mod:`multinode.app.watch`), not a thread of its own -- torch elastic's agent takes
in waiting nodes the same way (``num_nodes_waiting() > 0`` in its monitor loop): :meth:`GrowBack.tick` asks for a
missing node's replacement every ``interval`` seconds (RECOVER_WAIT) when none is under way
(:mod:`multinode.app.replacements`: one per node at a time, never asked twice), :meth:`GrowBack.take` reads a
replacement's event, and the loop gives the notice once :attr:`GrowBack.ready` and the job trains -- our trainer
takes a notice only once it trains (its watcher starts with the trainer; a SIGTERM while it starts would end it as a
failure), which the loop learns from the job's first mark; a user script runs behind ``training.guard``, which
takes a SIGTERM from its first instant.
"""

from __future__ import annotations

from collections.abc import Callable

from multinode.app.replacements import Replacements
from multinode.core.events import Events, ReplacementReady, ReplacementRefused


class GrowBack:
    """The missing nodes of an attempt on fewer nodes than asked (see the module doc)."""

    def __init__(self, missing: list[str], replacements: Replacements | None, interval: float,
                 say: Callable[[str], None], back: Callable[[str, float], None],
                 notice: Callable[[int, float], None] = lambda nodes, at: None) -> None:
        self.missing, self.replacements, self.interval = list(missing), replacements, interval
        self.say, self.back, self.on_notice = say, back, notice  # the node is back; the notice reached the job
        self.notified = False
        self._asked_at: float | None = None
        self._refused: set[str] = set()  # nodes whose refusal was told once (the asks go on quietly)

    @classmethod
    def idle(cls) -> "GrowBack":
        """Nothing missing: nothing to ask, no notice."""
        return cls([], None, 0.0, lambda message: None, lambda name, at: None)

    @property
    def ready(self) -> bool:
        """Every missing node is back (and there was one): time for the notice."""
        return self.replacements is not None and not self.missing

    def begin(self, events: Events) -> None:
        """The attempt's loop starts: replacements report to its queue from now on (one already done reports now)."""
        if self.replacements is not None and self.missing:
            self.replacements.listen(events)

    def end(self) -> None:
        if self.replacements is not None:
            self.replacements.listen(None)

    def tick(self, now: float) -> None:
        """Ask for the first missing node's replacement every ``interval`` seconds (the first ask one interval after
        the attempt began; a replacement already under way is not asked again)."""
        if not self.missing or self.replacements is None:
            return
        if self._asked_at is None:
            self._asked_at = now
            return
        if now - self._asked_at >= self.interval:
            self._asked_at = now
            self.replacements.ask(self.missing[0])

    def noticed(self, nodes: int, at: float) -> None:
        """The grow-back notice (given at ``at``) reached the job on ``nodes`` nodes: the attempt ends preempted and
        the run goes on on the whole cluster."""
        self.notified = True
        self.on_notice(nodes, at)

    def take(self, event: ReplacementReady | ReplacementRefused) -> None:
        """A replacement's event: the node is back, or (said once per node) it was refused and is asked again."""
        if event.node not in self.missing:
            return
        if isinstance(event, ReplacementReady):
            self.missing.remove(event.node)
            self.back(event.node, event.at)
            self.say(f"{event.node} is back")
            if not self.missing:
                self.say("every node is back: the ranks take a checkpoint and the run resumes on the whole cluster")
        elif event.node not in self._refused:
            self._refused.add(event.node)
            self.say(f"{event.node}: still no replacement ({event.why}); asking again every {self.interval:.0f} s")
