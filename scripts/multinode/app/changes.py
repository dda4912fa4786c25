"""A membership change as an event inside one attempt: the run's decisions when a node is lost or noticed while the
survivors keep running, and when its replacement joins them (the attempt loop, :mod:`multinode.app.watch`, hands
these events here; :mod:`multinode.app.members` writes what the ranks read).

* **a node lost** (its part killed or its session lost, its machine gone, its ranks found frozen by the stall
  watchdog): cut off at once -- the survivors' connections to it closed, so their collective fails now, not at the
  process-group timeout -- and left behind: the next generation, without it, written to the survivors, its session
  dropped (never waited on: a node that does not answer costs the others nothing), its replacement asked for --
  the provider's replacement ends the old machine and whatever of the job still runs on it (a refused one leaves
  it to the attempt's sweep);
* **a rank's step waits** (``WAITING``, :mod:`training.waiting`: a step far past the rank's typical time): a TCP
  connection to every other member's SSH port, on a thread; one that takes none leaves as a lost node does, before
  any survivor's collective has failed -- a node whose link is cut while its machine runs ends no session, is not
  gone to the provider and sends no FIN, and the survivors would wait for the process-group timeout to say ``KEPT``;
* **survivors paused** (``KEPT`` records, one per surviving node): a node that neither sent one within
  :data:`KEPT_WINDOW` s nor is still being left (a notice's node exits 75; a node whose link was cut sends nothing)
  leaves the same way -- the survivors say who survived. With the first ``KEPT`` after a loss, a TCP connection to
  each silent member's SSH port (:mod:`multinode.app.look`, on a thread, its answer an event: ``Unreachable``): one that
  takes none leaves at once, window or not (a cut link, a machine gone: the kernel of a live machine answers a
  handshake however loaded). After the window, the run's look at the ones still silent -- their ranks' stacks and an
  SSH probe, side by side, on a thread (``Looked``) -- tells a frozen node from a survivor still blocked in the failed
  collective. Meanwhile the loop takes every other event: the provider's word that the machine is gone, or its
  session's end, leaves the node at once (the look's timeouts on a node that does not answer were ~5 s of the
  survivors' pause when they ran in turn on the loop; the look started at the first ``KEPT`` left 3 s);
* **a replacement ready, or refused**, and the new ranks' ``JOINING``: the node's way back, :mod:`multinode.app.joins`;
* **the ranks' WORLD**: the new world trains -- on the timeline (``world 3 -> 2 at step S``, ``node-2 joined at
  step S``) and in the ledger (the survivors' pause).

A change the job cannot take in its processes (:meth:`multinode.app.members.Members.usable`: MODE=mpi,
LAUNCHER=torchrun, a script without the helper, the head) is said in one line, and the loop's failure path --
the restart of every process -- takes over, as does a RECOVER budget spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from multinode.app import look
from multinode.app.joins import Joins
from multinode.app.members import Members
from multinode.app.stays import Stays
from multinode.backends.base import JobHandle, RunContext
from multinode.core.errors import NodeError
from multinode.core.events import Events, JobRecord, Looked, NodeEnded, NodeGone, Stalled, Unreachable
from multinode.app.watchers import frozen
from multinode.trainer import channel

KEPT_WINDOW = 2.0  # seconds after the first survivor's KEPT for every other survivor's


class Changes:
    """The run's side of membership changes during one attempt (see the module doc). ``recovery`` is the run's
    :class:`~multinode.app.recover.Recovery` (its budget, timeline and replacements); ``prepare(node)`` readies a
    replacement (the run's ``prepare_again``); ``capture``: the backend's look at the live ranks (None: none);
    ``events``: the attempt's queue, where the look at silent members puts its answer."""

    def __init__(self, ctx: RunContext, job: JobHandle, members: Members, recovery, prepare: Callable[[str], None],
                 say: Callable[[str], None], last_seen: dict[str, float], capture, events: Events) -> None:
        self.ctx, self.job, self.members, self.recovery = ctx, job, members, recovery
        self.say, self.last_seen, self.capture, self.events = say, last_seen, capture, events
        self.kept: dict[str, float] = {}  # survivors paused in this change: node -> when its KEPT came
        self.paused: dict[str, float] = {}  # every node that paused since the newest generation formed: -> when
        self.alive: set[str] = set()  # silent in this change, but answering with live ranks: waited for
        self.joins = Joins(ctx, job, members, recovery, prepare, say)  # the way back of the nodes that left
        self.stays = Stays(members, recovery, say, lambda name, why, pending: self.lose(
            name, why, pending, notice=True, told=True), self.blocked, lambda names: job.notice(names))  # noticed
        self.unended: set[str] = set()  # nodes that left while their old session still ran: its end is to come
        self.looks = 0  # the looks at silent members started in this attempt
        self.looking: int | None = None  # the look under way or answered, for the change now (None: none)
        self.reaching: int | None = None  # the same for the TCP reach that comes first
        self.looked: Looked | None = None  # its answer
        self.unreachable: dict[str, str] = {}  # its first part: silent members no TCP connection reaches
        self.suspecting: int | None = None  # the TCP reach a rank's WAITING asked for, under way
        self._told: set[str] = set()

    def blocked(self, name: str) -> str | None:
        """None when ``name`` can leave without a restart; else why not."""
        why = self.members.usable(name)
        if why is None and not self.recovery.may_recover():
            why = f"RECOVER={self.ctx.spec.recover} recoveries spent"
        return why

    def why_not(self, name: str) -> str | None:
        """:meth:`blocked`, said once per reason."""
        why = self.blocked(name)
        if why is not None and why not in self._told:
            self._told.add(why)
            self.say(f"{name}: {why}: the job restarts every process instead")
        return why

    def take(self, event, pending: set[str], capture, lost: tuple[str, ...], gone: dict[str, str]) -> bool:
        """The attempt loop's event, if it is one of a membership change: True when it was taken (the job goes on
        in its processes), False for the loop's other decisions. ``gone`` is the loop's record of vanished
        machines, kept up to date here too."""
        if self.stays.take(event, pending):
            return True
        if isinstance(event, JobRecord):
            if event.kind == channel.JOINING:
                pending.add(event.node)
            self.take_record(event, pending)
            return True
        if self.joins.take(event):
            return True
        if isinstance(event, Looked):
            if event.number == self.looking:  # not a look of an earlier change
                self.looked = event
                self.tick(pending)
            return True
        if isinstance(event, Unreachable):
            if event.number == self.suspecting:
                self._suspected(event, pending)
            elif event.number == self.reaching:
                self.unreachable.update(event.nodes)
                self.tick(pending)
            return True
        if isinstance(event, NodeGone):
            gone[event.node] = event.why
        if isinstance(event, NodeEnded) and event.node in self.unended:
            self.unended.discard(event.node)  # the old session of a node that left, its replacement maybe back
            return True
        if isinstance(event, (NodeEnded, NodeGone)) and event.node in self.joins.leaving:
            return True  # a node that already left: its end, or its machine's, changes nothing more
        if isinstance(event, NodeEnded) and self.joins.ended(event, pending):
            return True  # a replacement's ranks that ended before they joined: the job goes on without them
        found = self.lost_node(event, capture, lost)
        if found is None or self.why_not(found[0]) is not None:
            return False
        self.lose(found[0], found[1], pending, ended=isinstance(event, NodeEnded))
        return True

    def lose(self, name: str, why: str, pending: set[str], notice: bool = False, ended: bool = False,
             told: bool = False) -> None:
        """``name`` leaves the running job (module doc); ``pending`` loses it. Unless its part has ``ended`` (or it
        left on a notice: it exits), its old session's end is still to come -- maybe after its replacement is back
        in the job -- and changes nothing then. ``told``: a noticed node let go while its ranks train
        (:mod:`multinode.app.stays`): the new generation is written to it too."""
        at = self.last_seen.get(name, time.time())  # the last sign of life, not its detection
        survivors = [n for n in self.members.names if n != name]
        # The survivors' connections to the lost node (their collective with it fails now) and, the job's store kept,
        # their old group among themselves: a survivor blocked on another survivor's part of the failed collective
        # fails now too, instead of at the process-group timeout. One command per survivor, then the new generation
        # written -- both on the members' writer thread, the loop taking the change's next events meanwhile (one
        # benchmark run's loop was held 7.3 s in this method, the provider's word that the machine was gone waiting
        # behind it). The cut comes first: a survivor that already had the new generation would form the new group
        # while a slower survivor's cut still closes its connections to the others. A notice cuts nothing: every rank
        # stopped at the agreed step, none is in a collective -- its SSH round only delayed the write (5 s bound).
        cut = (lambda: None) if notice else lambda: self.ctx.runner.cut_off([name], survivors,
                                                                           spare_port=self.ctx.spec.rdzv_port,
                                                                           peers=survivors)
        self.members.leave(name, first=cut, told=told)
        pending.discard(name)
        self.joins.leaving.add(name)
        if not (notice or ended):
            self.unended.add(name)
        self.job.depart(name)
        if not notice:
            self.job.drop(name)  # never waited on; what of it still runs goes with the machine its replacement ends
        self.recovery.left_in_process(name, "let go" if told else "notice" if notice else "lost", why, at,
                                      len(survivors))

    def take_record(self, event: JobRecord, pending: set[str]) -> None:
        """A record the ranks sent about the membership."""
        if event.kind == channel.WORLD:
            generation = int(event.data.get("generation", 0))
            self.members.formed = max(self.members.formed, generation)
            if generation == 0:
                self.members.supported = True
                return
            self._settled()
            self.alive.clear()
            self.paused.clear()
            self.recovery.world_changed(event.data, time.time())
            self.joins.formed()  # a join that waited for this generation to form
        elif event.kind == channel.KEPT:
            self.kept.setdefault(event.node, time.time())
            self.paused.setdefault(event.node, time.time())
            kept = channel.Kept.read(event.data)
            if kept is None or kept.why != "leave":  # the noticed nodes leave by themselves: looked at only if late
                self._reach(self._silent(pending))
            self._again()
        elif event.kind == channel.JOINING:
            self.joins.joining(event.node)
        elif event.kind == channel.WAITING:
            self._suspect(event.node, pending)

    def tick(self, pending: set[str]) -> None:
        """Survivors paused: the members that sent no KEPT leave -- at once when each of them has ended (a notice's
        node exits 75) or no TCP connection reaches it (:meth:`_reach`); once the window is over and the look
        (:meth:`_look`) has answered, one whose ranks the stacks show frozen, or that does not answer SSH. One that
        answers with live ranks is a survivor that has not seen the change yet (blocked in the failed collective
        until its process-group timeout): it is waited for."""
        self.joins.tick()
        if not self.kept:
            return
        for name in [n for n in self._silent(pending) if n in self.unreachable]:  # no need to wait for the window
            if self.why_not(name) is None:
                self.lose(name, f"its SSH port takes no connection while its peers paused ({self.unreachable[name]})",
                          pending)
        silent = [n for n in self.members.names if n not in self.kept and n not in self.alive]
        waiting = self._silent(pending)
        if waiting:
            if time.time() - min(self.kept.values()) < KEPT_WINDOW:
                return
            if self.looked is None or not set(waiting) <= set(self.looked.silent):
                if self.looked is not None:  # a member silent since the look: look again
                    self.looking = self.looked = None
                self._look(waiting)
                return
        named, answers = (self.looked.named, self.looked.answers) if self.looked else ({}, {})
        for name in silent:
            ended = name not in pending
            if not ended and name not in named and answers.get(name, (False, ""))[0]:
                self.alive.add(name)  # a survivor still in the failed collective: it pauses when it times out
                continue
            why = "its ranks left on a notice" if ended else named.get(name) or \
                f"it does not answer SSH while its peers paused ({answers.get(name, (False, '?'))[1]})"
            if self.why_not(name) is None:
                self.lose(name, why, pending, notice=ended)
        if not [n for n in self.members.names if n not in self.kept and n not in self.alive]:
            self._settled()

    def _again(self) -> None:
        """Every member paused and none left, nothing newer written (no leave or join under way): a collective
        failed with every node answering -- a peer slower than the process-group timeout, the last to pause -- and
        the same members form the next generation in their processes (a recovery), instead of each waiting out the
        reform timeout and the restart path."""
        members = self.members
        if set(members.names) - set(self.paused) or members.generation > members.formed or members.pending or \
                not members.supported or not self.recovery.may_recover():
            return
        last = max(self.paused, key=self.paused.get)
        members.again()
        self.recovery.reformed(f"every node's ranks paused with none gone ({last} last: a collective failed, a peer "
                               f"slower than PG_TIMEOUT={self.ctx.spec.pg_timeout} s or the network between them)",
                               min(self.paused.values()), len(members.names))

    def _silent(self, pending: set[str]) -> list[str]:
        """The members that neither paused nor ended nor answered a look with live ranks."""
        return [n for n in self.members.names if n not in self.kept and n not in self.alive and n in pending]

    def _settled(self) -> None:
        """The change settled: the next KEPT opens a new window and a new look."""
        self.kept.clear()
        self.looking = self.looked = self.reaching = None
        self.unreachable = {}

    def _look(self, silent: list[str]) -> None:
        """The look at ``silent`` members, on a thread, unless one is under way or answered: their ranks' stacks and
        an SSH probe side by side; the answer an event on the attempt's queue (``Looked``)."""
        if self.looking is not None or not silent:
            return
        self.looks += 1
        self.looking = self.looks
        look.look(self.ctx, self.capture, self.members.names[0], self.looks, tuple(silent), self.events)

    def _reach(self, silent: list[str]) -> None:
        """Which of ``silent`` no TCP connection reaches, on a thread, unless asked already in this change: the
        answer an event (``Unreachable``); those leave at once, without waiting for the window."""
        if self.reaching is not None or not silent:
            return
        self.looks += 1
        self.reaching = self.looks
        look.reach(self.ctx, self.looks, tuple(silent), self.events)

    def _suspect(self, waiter: str, pending: set[str]) -> None:
        """A rank of ``waiter`` says its step waits (``WAITING``): which other member no TCP connection reaches, on a
        thread, unless such a reach is under way; the answer an event (``Unreachable``, :meth:`_suspected`)."""
        others = tuple(n for n in self.members.names if n != waiter and n in pending)
        if self.suspecting is not None or not others:
            return
        self.looks += 1
        self.suspecting = self.looks
        look.reach(self.ctx, self.looks, others, self.events)

    def _suspected(self, event: Unreachable, pending: set[str]) -> None:
        """The reach a WAITING asked for: a member it did not reach leaves now -- where the job can take the change
        in its processes; elsewhere the failed collective's timeout ends the attempt as before, unsaid here."""
        self.suspecting = None
        for name, why in event.nodes.items():
            if name in self.members.names and name in pending and self.blocked(name) is None:
                self.lose(name, f"its SSH port takes no connection while a peer's step waits ({why})", pending)

    def lost_node(self, event, capture, lost: tuple[str, ...]) -> tuple[str, str] | None:
        """(node, why) when ``event`` loses a node of the job: its part killed or its session lost, its machine
        gone, or -- a stall -- its rank found frozen in the stacks (``capture``: the run's look at the live ranks),
        stopped or stuck in the kernel. None otherwise (a part's own failure is no loss)."""
        if isinstance(event, NodeEnded) and event.node in self.members.names and event.killed:
            return event.node, (event.error.message if event.error else f"killed (exit code {event.exit_code})")
        if isinstance(event, NodeGone) and event.node in self.members.names:
            return event.node, f"its machine is gone ({event.why})"
        if isinstance(event, Stalled):
            head = self.members.names[0]
            found = frozen(capture(NodeError(head, "job", None, event.why), lost), head)
            if found is not None:
                return found[0], f"{found[1]} ({event.why})"
        return None
