"""A change of the job's membership, as the ranks live it: pause, leave the old group, form the run's new world, agree
on where they are, go on -- without a new process (:mod:`training.membership` has the contract with the run).

Three ways into a change, each a :class:`Change` raised out of the step that met it:

* ``"lost"`` -- a collective failed because a peer is gone (:func:`training.survivor.keep`): the last completed step
  is what this rank holds (a step the failure interrupted changed no weight -- DDP averages inside ``backward`` --
  and its RNG draws are put back, its partial gradients dropped);
* ``"leave"`` -- the ranks agreed that the nodes with a notice leave (:class:`training.notice.Agreement`): those
  ranks exit 75 at once (no checkpoint: the others hold everything), the others go on;
* ``"reform"`` -- the ranks agreed that the run wrote a newer generation (a node joins): every rank changes at the
  same step.

Then every surviving rank: one ``KEPT`` record per node (the run's timeline: the pause began), the old group given
up, the run's membership waited for (at most ``MULTINODE_REFORM_TIMEOUT`` s, 60 by default: without it the trainer
writes the survivor snapshot and fails, and the run restarts every process from it -- the fallback), the new group
formed, :func:`training.membership.synchronize` (the freshest state to whoever lacks it), the world's parts made
again (:meth:`training.trainer.Trainer.join_world`), and rank 0 sends ``WORLD``: the generation, the step, the
world sizes before and after, who joined or left, and the seconds from the pause to this point.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Protocol

from . import channel, membership, notice
from .dist_env import Launch, World

log = logging.getLogger("training")


class Change(Exception):
    """The job's membership changes here (module doc): why, and where this rank is after its last completed step
    (our trainer: (epoch, samples of it trained); a user's loop: what it says), since when it has paused, and for
    ``"lost"``, the RNG states to put back (the interrupted step's draws) and the error."""

    def __init__(self, why: str, position, began: float, rng: dict | None = None, error: str = ""):
        super().__init__(f"membership change ({why}) at {position}")
        self.why, self.position, self.began, self.rng, self.error = why, position, began, rng, error


def members(world: World) -> notice.Members | None:
    """What the notice agreement carries of the membership (None where it cannot change)."""
    member = world.member
    if member is None:
        return None
    members = notice.Members(world.rank, world.world_size, member.newest)
    members.generation = member.generation
    return members


class Host(Protocol):
    """What a change needs of the loop it happens in: our :class:`~training.trainer.Trainer`, or a user's loop
    through :class:`training.elastic.Elastic`."""

    world: World
    step: int  # the optimizer steps taken (a change keeps the freshest rank's)
    agreement: notice.Agreement
    marks: object  # training.marks.Marks: the ledger's pause
    timeout: float  # the process group's

    def paused(self, what: Change) -> None:
        """The step the change met is given up (its RNG draws put back, its partial gradients dropped)."""

    def state_of(self, position) -> dict:
        """What a rank that lacks it receives: everything to go on from ``position``."""

    def apply(self, state: dict) -> None:
        """Take a live peer's :meth:`state_of`."""

    def rejoined(self, position, adopted: bool) -> None:
        """Go on in the new world from ``position`` (``adopted``: this rank took a peer's state)."""


def change(host: Host, what: Change) -> None:
    """Pause, leave, form the new world, agree, go on (module doc); Left when this rank is not in it."""
    world, member = host.world, host.world.member
    before, step_before = world.world_size, host.step
    if what.why == "lost":
        host.paused(what)
    elif what.why == "leave" and world.rank in host.agreement.leaving:
        raise membership.Left(f"{member.host} has a notice: its ranks leave the job at step {host.step}")
    if world.local_rank == 0 and what.why != "reform":  # the survivors of a departure say so: the run learns who
        channel.send(channel.KEPT, {"rank": world.rank, "host": member.host, "step": host.step,
                                    "position": what.position, "in_memory": True, "error": what.error[:300],
                                    "why": what.why})
    parts = Parts()  # where the pause goes: seconds per part, in the log line and the WORLD record
    member.leave_group()
    parts.mark("leave")
    written = member.wait(member.generation, membership.reform_timeout())  # NoNewMembership: the fallback's
    parts.mark("wait")
    place = member.place_in(written)  # Left: this node is not in the new world
    member.form(place, world.backend, host.timeout)
    parts.mark("form")
    host.world = World(Launch(world.launch.launcher, place.rank, place.world_size, world.local_rank,
                              world.launch.master_addr, world.launch.master_port), world.backend, None, member)
    position = membership.synchronize(host, what.position)
    parts.mark("sync")
    host.rejoined(position, host.step != step_before)
    host.agreement.restart(members(host.world))
    parts.mark("rebuild")
    began = _paused_since(host, what)
    seconds = round(time.time() - began, 3)
    log.info("membership generation %d: %d -> %d ranks at step %d, %.2f s after the pause (%s; %s)", place.generation,
             before, place.world_size, host.step, seconds, what.why, parts.said())
    host.marks.pause(began, seconds, what.why)  # the ledger's: the survivors' pause
    if host.world.rank == 0:
        channel.send(channel.WORLD, {"generation": place.generation, "step": host.step,
                                     "world_size": place.world_size, "before": before, "seconds": seconds,
                                     "joined": list(written.joining), "why": what.why, "parts": parts.seconds})


class Parts:
    """The seconds each part of a change took on this rank, marked as each ends (before the first: the pause up to
    the change, not counted here)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.time()

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now

    def said(self) -> str:
        return ", ".join(f"{name} {value:.2f} s" for name, value in self.seconds.items())


def _paused_since(host: Host, what: Change) -> float:
    """When the ranks stopped training: for a lost peer, the end of the last step completed (the failed step's work
    and the wait in its collective until the peer's connections were cut are no training either); for an agreed
    change, the step it was agreed at."""
    last = getattr(host.marks, "last", None)
    return min(what.began, last[0]) if what.why == "lost" and last else what.began


def lost(err: BaseException, position, rng: dict | None) -> Change:
    """A lost peer in a job whose membership can change: the change to make (``survivor.keep`` raises it)."""
    return Change("lost", position, time.time(), rng, f"{socket.gethostname()}: {str(err).splitlines()[0][:200]}")
