"""The job's membership, changed while it runs: a lost or noticed node leaves, a new one joins, and the other ranks
keep their processes -- the model, the optimizer and the data position they hold in memory (docs/recovery.md).

The run and the ranks share the channel's contract (:mod:`training.channel`):

* ``MULTINODE_MEMBERSHIP=<run dir>/membership.json`` is set by the run when it can change the job's membership in
  the job's own processes (RECOVER, the static launcher, no MPI); without it nothing here is used, and a lost peer
  ends the job as before (:mod:`training.survivor`'s snapshot, then a restart of every process);
* generation 0 is the job's first world, as the launcher started it. The group's store is one ``TCPStore`` on the
  head, hosted by rank 0's process (``MASTER_ADDR:MASTER_PORT``) for the job's whole life, and every generation's
  process group lives under its own key prefix ``gen<g>/`` (torch's ``PrefixStore``: a new group never reads an
  old one's keys). Rank 0 sends a ``WORLD`` record of generation 0 once its group exists: the run then knows the
  job takes membership changes;
* a later generation is the run's word, written to ``membership.json`` on the nodes it concerns
  (:class:`training.channel.Membership`: the hosts, head first, each with ``nproc`` ranks): a rank's new rank is
  its host's place times ``nproc`` plus its local rank; a rank whose host is not listed leaves;
* the surviving ranks learn of it where they wait for it (their group failed: a peer lost; or they agreed to let a
  noticed node go), the running ranks at their notice agreement (:class:`training.notice.Agreement`: the newest
  generation any rank has seen, so every rank changes at the same step); a new node's ranks start with the file
  already there, say ``JOINING`` once they are ready (imports and data done) and wait in the new group's
  rendezvous, which the run then opens to the others.

In the new group the ranks first agree on where they are (:func:`synchronize`): every rank's last completed step;
the freshest rank's whole training state -- model, optimizer, scheduler, scaler, RNG states, the step, the epoch
and the samples of it trained, the early-stopping record -- is broadcast to the ranks that do not hold it (a new
rank, or one that did not finish the step its peer did), a live peer's memory instead of a file. The epoch goes on
at that sample with the same global batch, re-sharded over the new world (:mod:`training.sampler`).

NCCL: a failed communicator is aborted (``destroy_process_group`` aborts the default group's communicators;
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``, set by :mod:`training.dist_env`, raises the failed collective in Python
instead of tearing the process down) and the new group is a new communicator: what docs/gpu.md records from a run
on a GPU. gloo's destroy closes its sockets. MPI cannot lose a rank (its runtime ends every rank): no MPI job
changes its membership.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from . import channel

log = logging.getLogger("training")

POLL_SECONDS = 0.05  # how often a waiting rank reads membership.json
REFORM_TIMEOUT_ENV = "MULTINODE_REFORM_TIMEOUT"
REFORM_TIMEOUT = 60.0  # seconds a surviving rank waits for the run's new membership before giving up (fallback)
LEAVE_SECONDS = 5.0  # how long leaving a failed group is waited for (NCCL's teardown can hang: docs/gpu.md)


class Left(Exception):
    """This rank's host is not in the new membership: it leaves the job (a notice's node, exit 75)."""


class NoNewMembership(Exception):
    """The run said nothing within the reform timeout: the restart path takes over."""


@dataclass(frozen=True)
class Place:
    """A rank's place in one generation of the job."""

    generation: int
    rank: int
    world_size: int
    hosts: tuple[str, ...]


def path_from_env(env=None) -> Path | None:
    """Where the run writes the job's membership (``MULTINODE_MEMBERSHIP``), or None: no membership change."""
    value = (os.environ if env is None else env).get(channel.MEMBERSHIP_ENV)
    return Path(value) if value else None


def reform_timeout(env=None) -> float:
    text = (os.environ if env is None else env).get(REFORM_TIMEOUT_ENV)
    return float(text) if text else REFORM_TIMEOUT


class Member:
    """This process's view of the job's membership: the file the run writes, the store every generation's group
    meets on, and its own host and local rank."""

    def __init__(self, path: Path, local_rank: int, host: str | None = None) -> None:
        self.path, self.local_rank = path, local_rank
        self.host = host or socket.gethostname()
        self.store = None  # the job's TCPStore (rank 0 hosts it), made by :meth:`connect`
        self.place: Place | None = None

    @property
    def generation(self) -> int:
        return self.place.generation if self.place else 0

    def read(self) -> channel.Membership | None:
        """The membership the run last wrote here (None: none yet, or not whole)."""
        try:
            return channel.Membership.from_json(self.path.read_text())
        except OSError:
            return None

    def newest(self) -> int:
        """The newest generation written here (this one when none is newer)."""
        written = self.read()
        return max(self.generation, written.generation if written else 0)

    def wait(self, above: int, timeout: float) -> channel.Membership:
        """The first membership newer than generation ``above`` the run writes here; NoNewMembership after
        ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            written = self.read()
            if written is not None and written.generation > above:
                return written
            if time.monotonic() > end:
                raise NoNewMembership(f"no membership newer than generation {above} within {timeout:g} s")
            time.sleep(POLL_SECONDS)

    def place_in(self, membership: channel.Membership) -> Place:
        """This rank's place in ``membership``; Left when its host is not in it."""
        if self.host not in membership.hosts:
            raise Left(f"{self.host} is not in generation {membership.generation} of the job")
        rank = membership.hosts.index(self.host) * membership.nproc + self.local_rank
        return Place(membership.generation, rank, membership.world_size, tuple(membership.hosts))

    def connect(self, master_addr: str, master_port: int, rank0: bool, timeout: float) -> None:
        """The job's store: hosted by rank 0 of generation 0 (the head) for the job's life, a client elsewhere."""
        import torch.distributed as dist

        self.store = dist.TCPStore(master_addr, master_port, None, is_master=rank0,
                                   timeout=timedelta(seconds=timeout), wait_for_workers=False)

    def form(self, place: Place, backend: str, timeout: float) -> None:
        """The process group of ``place``'s generation (every rank of it must call this). Each rank first says it
        is here and waits for every other, up to the reform timeout: a survivor may still sit in the failed group's
        collective for up to the process-group timeout (a peer lost with its network, no reset sent: the collective
        ends only when the timeout does) while the others are here already, and the group's own rendezvous waits no
        longer than that timeout -- the others gave up just as it arrived (the spot day's quick replay, a cold run
        of 2026-11-29: node-2's and node-3's ranks timed out on generation 1's rendezvous after 30 s, as the head's
        all-reduce on the lost node-1 did)."""
        import torch.distributed as dist

        store = dist.PrefixStore(f"gen{place.generation}/", self.store)
        store.set(f"here/{place.rank}", "1")
        store.wait([f"here/{rank}" for rank in range(place.world_size)],
                   timedelta(seconds=max(timeout, reform_timeout())))
        dist.init_process_group(backend, store=store, rank=place.rank, world_size=place.world_size,
                                timeout=timedelta(seconds=timeout))
        self.place = place

    def join(self, place: Place, backend: str, timeout: float) -> None:
        """A new node's rank: says it is ready (``JOINING``; the run opens ``place``'s generation once every new rank
        has said so) and forms that generation's group with the running ranks."""
        channel.send(channel.JOINING, {"generation": place.generation, "host": self.host, "rank": place.rank})
        self.form(place, backend, timeout)

    def leave_group(self) -> None:
        """The current group given up (its peers may be gone): gloo closes its sockets, NCCL aborts its
        communicators. On a thread, waited for at most :data:`LEAVE_SECONDS`: after NCCL's watchdog has aborted a
        communicator, neither ``destroy_process_group()`` nor ``_abort_process_group()`` returned within 30 s on an
        H200 (docs/gpu.md), while a new group in the same process formed at once -- both calls unset the default
        group first, so the new one does not wait for the old one's teardown."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return

        def destroy() -> None:
            try:
                dist.destroy_process_group()
            except Exception as err:  # noqa: BLE001 -- a broken group may fail its own teardown: it is gone anyway
                log.warning("leaving the failed group: %s", err)

        leaving = threading.Thread(target=destroy, name="leave-group", daemon=True)
        leaving.start()
        leaving.join(LEAVE_SECONDS)
        if leaving.is_alive():
            log.warning("the failed group's teardown still runs after %g s; the new group forms beside it",
                        LEAVE_SECONDS)


def first_place(launch, path: Path, host: str | None = None) -> tuple[Member, Place]:
    """At start: this rank's member and place -- generation 0 from the launcher's variables, or, for a rank of a
    node the run started to join a running job (the file already there, newer than 0), the file's."""
    member = Member(path, launch.local_rank, host)
    written = member.read()
    if written is not None and written.generation > 0:
        return member, member.place_in(written)
    return member, Place(0, launch.rank, launch.world_size, ())


def join(host, timeout: float):
    """A new node's rank, its own state built: in the running job (:meth:`~training.dist_env.World.join`), its peers'
    state taken (:func:`synchronize`). Returns the agreed position."""
    host.world.join(timeout)
    return synchronize(host, None)


def synchronize(host, position):
    """In a new group: where every rank is, agreed (module doc). ``position``: where this rank's last completed step
    left it (its host's own terms), None for a rank that holds no state yet (a new node's). The freshest rank's
    state (``host.state_of``) goes to every rank that does not hold it (``host.apply``); the agreed position is
    returned on every rank."""
    mine = (host.step, position) if position is not None else (-1, None)
    everyone = host.world.gather(mine)
    step, where = max(everyone, key=lambda entry: entry[0])
    if step < 0:
        raise RuntimeError("no rank of the new group holds the job's state")
    source = next(rank for rank, entry in enumerate(everyone) if entry[0] == step)
    if any(entry[0] != step for entry in everyone):
        state = host.state_of(where) if host.world.rank == source else None
        state = host.world.broadcast(state, src=source)
        if host.world.rank != source and mine[0] != step:
            host.apply(state)
    return where
