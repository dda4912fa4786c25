"""The way back into the running job for a node that left it in this attempt (the other half of a membership
change, :mod:`multinode.app.changes`): its replacement's answer, and its ranks joining the others.

* **ready** (:class:`~multinode.core.events.ReplacementReady`): on the timeline, then prepared (code, data, ENV
  file, the job's files) on a thread, its generation written to it, its part started;
* **refused** (no capacity, or the replacement's own error): said and on the timeline (once per node), and asked
  again every RECOVER_WAIT seconds while the job goes on without it -- growing back (:mod:`multinode.app.growback`)
  knows only the nodes missing when the attempt began, and the run once ended a node short with nothing said;
* **its ranks say** ``JOINING``: its generation is opened to the running ranks -- once every earlier generation has
  formed (they take the newest written: one they skipped would leave a survivor alone in it) -- which change at their
  next agreement: they pause only once the new ranks are ready;
* **its part ends before that** (:meth:`Joins.ended`: its ranks failed or were killed while they started): the
  running ranks never knew of it and go on; its generation is withdrawn (a later join would otherwise wait for it
  to form, and the job with it). Killed, or its machine lost: a replacement is asked again, as for any lost node;
  failed by themselves (a bug or a missing file on a fresh machine): not asked again -- a new machine would fail
  the same way -- and the line names its log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from multinode.app.members import Members
from multinode.backends.base import JobHandle, RunContext
from multinode.core.events import NodeEnded, ReplacementReady, ReplacementRefused
from multinode.trainer import channel


class Joins:
    """The nodes that left in this attempt (``leaving``) and their way back (module doc). ``recovery``: the run's
    :class:`~multinode.app.recover.Recovery` (its timeline and replacements); ``prepare(node)`` readies a
    replacement (the run's ``prepare_again``)."""

    def __init__(self, ctx: RunContext, job: JobHandle, members: Members, recovery, prepare: Callable[[str], None],
                 say: Callable[[str], None]) -> None:
        self.ctx, self.job, self.members, self.recovery, self.prepare, self.say = \
            ctx, job, members, recovery, prepare, say
        self.leaving: set[str] = set()  # nodes that left in this attempt, not (yet) back
        self.ready: list[str] = []  # new nodes whose ranks said JOINING, their generation not yet opened
        self.refused: dict[str, float] = {}  # nodes whose replacement was refused: when (monotonic), asked again
        self.told: set[str] = set()  # nodes whose refusal was said: once each (as growing back); asks go on quietly

    def take(self, event) -> bool:
        """A replacement's answer for a node that left in this attempt; False for another node's (growing back's)
        or another event."""
        if not isinstance(event, (ReplacementReady, ReplacementRefused)) or event.node not in self.leaving:
            return False
        if isinstance(event, ReplacementRefused):
            if event.node not in self.told:
                self.told.add(event.node)
                self.recovery.timeline.add("replacement refused", f"{event.node}: {event.why}")
                self.say(f"{event.node}: no replacement ({event.why}); the job goes on without it, asking again "
                         f"every {self.ctx.spec.recover_wait:.0f} s")
            self.refused[event.node] = time.monotonic()
            return True
        self.leaving.discard(event.node)
        self.told.discard(event.node)
        self.recovery.timeline.add("node ready", event.node, at=event.at)
        threading.Thread(target=self._join, args=(event,), name=f"mn-join-{event.node}", daemon=True).start()
        return True

    def ended(self, event: NodeEnded, pending: set[str]) -> bool:
        """A joining node's part ended before the running ranks took it in (module doc); False for any other end
        (a member's, or a part that ended well: the job itself ended)."""
        name, code = event.node, event.exit_code
        if name not in self.members.pending or (not event.lost and code in (0, channel.EXIT_PREEMPTED)):
            return False
        self.members.abandon(name)
        if name in self.ready:
            self.ready.remove(name)
        pending.discard(name)
        self.job.depart(name)
        error = event.error or self.job.fail_node(name, f"exited with code {code}", lost=False)
        why = error.message if error is not None else f"exit code {code}"
        self.recovery.timeline.add("join failed", f"{name}: {why}")
        if event.killed:
            self.leaving.add(name)
            self.say(f"{name}'s ranks ended before they joined ({why}); the job goes on without it; asking "
                     f"{self.ctx.inv.provider} for a replacement again")
            self.recovery.replacements.ask(name)
        else:
            where = f"; its log: {error.log_path}" if error is not None and error.log_path else ""
            self.say(f"{name}'s ranks failed before they joined ({why}{where}); the job goes on without it, not "
                     f"asking for another machine (a fresh one would fail the same way)")
        return True

    def tick(self) -> None:
        """A refused replacement asked again once RECOVER_WAIT has passed."""
        for name, at in list(self.refused.items()):
            if time.monotonic() - at >= self.ctx.spec.recover_wait:
                del self.refused[name]
                self.recovery.replacements.ask(name)

    def joining(self, name: str) -> None:
        """``name``'s ranks are ready (``JOINING``): its generation opened when it can be."""
        self.ready.append(name)
        self.open(name)

    def formed(self) -> None:
        """A new generation formed: the joins that waited for it are opened."""
        for name in list(self.ready):
            self.open(name)

    def open(self, name: str) -> None:
        if self.members.formed < self.members.pending_after(name) or not self.members.open(name):
            return
        self.ready.remove(name)
        self.say(f"{name} is ready: the running ranks take it in at their next agreement")

    def _join(self, event: ReplacementReady) -> None:
        name = event.node
        try:
            self.ctx.inv = event.inventory.first(self.ctx.spec.nodes)
            self.ctx.runner.retarget(self.ctx.inv)
            self.prepare(name)
            self.members.join(name)
            self.job.rejoin(name)
        except Exception as err:  # noqa: BLE001 -- a node that cannot be readied stays out; the job goes on
            self.say(f"{name} is back but could not be readied ({err}); the job goes on without it")
            return
        self.say(f"{name} is back: its ranks start and join the running job")
