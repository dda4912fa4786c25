"""A noticed node that keeps training until its replacement is ready: the run's side of staying
(``training/notice.py``'s ``Agreement.stays``; the ranks' side).

A spot interruption notice gives two minutes; a replacement takes 40 s to three minutes to launch. When the noticed
node's ranks left at once, the job ran a node short for the whole launch. Now, in a job that takes membership
changes in its processes (RECOVER, the static launcher), the noticed ranks say ``NOTICE`` and train on, and here:

* **NOTICE** from a member, the first of its ranks: on the timeline, and its replacement asked at once *beside*
  the noticed machine (:meth:`~multinode.app.replacements.Replacements.ask` with ``beside``): the provider launches
  the new machine, then calls back before it ends the old one;
* **the call back** (a :class:`~multinode.core.events.Retire` on the attempt's queue, the provider's thread waiting):
  the noticed node leaves the running job -- the next generation, without it, written to the others and to it, so
  its ranks leave at their next agreement (exit 75) and the others go on in their processes -- and, once its ranks
  have ended, the provider ends the old machine and makes the new one, which joins as any replacement does
  (:mod:`multinode.app.joins`). A node that cannot leave alone (the head, whose rank 0 holds the job's store) is
  not told: its ranks are stopped now -- SIGTERM with the grace to them, so every rank stops at the agreed step
  with the coordinated checkpoint -- and the provider waits until the run, between attempts, waits for the
  replacement (after the attempt's sweep): the restart path, the new machine already launched (waited for however
  long a whole launch would take: :data:`~multinode.app.replacements.SWAP_PATIENCE`). Its ranks stopped, before,
  only at the notice's deadline: the new machine, ready, was paid idle until then (node-0's in the spot day's
  replay of 2026-12-07: about 40 s);
* **a late replacement**: the ranks leave by themselves at the action time less ``STAY_MARGIN``, as before staying;
  the replacement goes on and joins when it is ready.

Where the old machine must end before the new one launches (EC2 here: the node's instance index is one machine,
:meth:`multinode.providers.aws.provider.AwsProvider.replace`), the provider calls back first (``Retire.ready``
false) and the node leaves at once -- staying pays only where the launch runs beside the noticed machine (the
local provider's drilled launch) -- but the head, which would only trade its training for a wait on the whole
launch, trains on and stops at the notice's deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from multinode.app.members import Members
from multinode.core.events import JobRecord, NodeEnded, Retire
from multinode.trainer import channel


class Stays:
    """The noticed nodes of one attempt that train on (module doc). ``lose(name, why, pending)`` lets a node go as
    a noticed one (:meth:`multinode.app.changes.Changes.lose`, its ranks told); ``blocked(name)``: why it cannot
    leave alone, or None; ``stop(names)``: the grace's SIGTERM to their ranks (the job's notice), run here on a thread
    the attempt joins at its end (:meth:`join`): every rank stops with the coordinated checkpoint."""

    def __init__(self, members: Members, recovery, say: Callable[[str], None],
                 lose: Callable[[str, str, set[str]], None], blocked: Callable[[str], str | None],
                 stop: Callable[[list[str]], object]) -> None:
        self.members, self.recovery, self.say, self.lose, self.blocked = members, recovery, say, lose, blocked
        self.stop, self.stopping = stop, None  # the head's stop under way (a thread), or None
        self.noticed: set[str] = set()  # nodes whose NOTICE was taken (its first rank's)
        self.letting_go: set[str] = set()  # told to leave: the provider goes on once their ranks have ended

    def take(self, event, pending: set[str]) -> bool:
        """A NOTICE record or a Retire: True when taken. The end of a node let go lets its replacement go on, and is
        left to the loop's other decisions (False)."""
        if isinstance(event, JobRecord) and event.kind == channel.NOTICE:
            self._noticed(event)
            return True
        if isinstance(event, Retire):
            self._retire(event.node, pending, event.ready)
            return True
        if isinstance(event, NodeEnded) and event.node in self.letting_go:
            self.letting_go.discard(event.node)
            self.recovery.replacements.retired(event.node)
        return False

    def _noticed(self, event: JobRecord) -> None:
        name = event.node
        if name in self.noticed or name not in self.members.names or not self.recovery.may_recover():
            return
        leave_by = float(event.data.get("leave_by") or time.time())
        self.noticed.add(name)
        self.recovery.timeline.add("notice", f"{name}: spot interruption notice ({event.data.get('time')}); its "
                                             f"ranks train on until its replacement is ready")
        self.recovery.timeline.add("replacement asked", f"{name} (beside it)")
        self.say(f"{name} got a spot interruption notice: its ranks train on while {self.recovery.cluster.provider} "
                 f"launches its replacement beside it (they leave when it is ready, at the latest "
                 f"{time.strftime('%H:%M:%S', time.localtime(leave_by))})")
        self.recovery.replacements.ask(name, beside=True)

    def _retire(self, name: str, pending: set[str], ready: bool = True) -> None:
        """The provider waits to end ``name``'s machine (``ready``: its replacement is ready to take its place): let
        the node go (module doc)."""
        if name not in self.members.names or name not in pending:  # it left already (its deadline, a loss)
            self.recovery.replacements.retired(name)
            return
        why = self.blocked(name)
        if why is not None:  # the head: the provider waits until recovery waits for the replacement
            if ready and self.recovery.may_recover():  # not a budget spent: nothing would take the job on then
                self.say(f"{name}'s replacement is ready; {why}: its ranks stop now (every rank's coordinated "
                         f"checkpoint) and the job starts again on the replacement")
                self.stopping = threading.Thread(target=self.stop, args=([name],), name=f"mn-stop-{name}", daemon=True)
                self.stopping.start()
            else:
                self.say(f"{name}'s replacement is {'ready' if ready else 'launched once its machine is gone'}; "
                         f"{why}: its ranks stay until they stop at the notice's deadline")
            return
        self.letting_go.add(name)
        self.lose(name, "its replacement is ready", pending)

    def join(self, timeout: float) -> None:
        """The attempt ended: a head's stop still under way is done first (at most ``timeout`` seconds)."""
        if self.stopping is not None:
            self.stopping.join(timeout)
