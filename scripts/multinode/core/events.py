"""What happens during one attempt of a run, as typed events on one queue: the parts report, the run decides.

The job's parts (a node's part of an SSH job, a SLURM batch job), the watchers (the provider's word on vanished
machines, the stall watchdog) and the replacements under way put events on the attempt's :class:`Events`; the
run's attempt loop (:mod:`multinode.app.watch`) takes them one at a time and decides -- gang-stop, cut-off, the
look at the live ranks, a notice, a relaunch, growing back -- in one place, for every backend. torch elastic's
agent is the model: one monitor loop reads one state and decides; taking in new nodes is a branch of it.

Nothing here decides anything, and nothing here does I/O.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from multinode.core.errors import NodeError


@dataclass(frozen=True)
class NodeEnded:
    """A node's part of the job ended: its exit code, or ``lost`` (its SSH session died: ``error`` says how)."""

    node: str
    exit_code: int | None
    lost: bool = False
    error: NodeError | None = None
    final: bool = False  # it cannot be started again (an elastic relaunch already failed)

    @property
    def killed(self) -> bool:
        return part_killed(self.lost, self.exit_code)


def part_killed(lost: bool, exit_code: int | None) -> bool:
    """A part lost, or ended by a signal: no exit code, a negative one (SSH's -1), 128 + signal (a shell's)."""
    return lost or exit_code is None or exit_code < 0 or exit_code >= 128


@dataclass(frozen=True)
class JobEnded:
    """The whole job ended at once (a scheduler's batch job): the backend's own account of it (``ended``), which
    only the backend maps to an outcome."""

    ended: Any


@dataclass(frozen=True)
class JobError:
    """The backend cannot go on with the job (a scheduler that holds it, a login node that stopped answering): the
    job's failure, on the node that says it."""

    error: NodeError


@dataclass(frozen=True)
class NodeGone:
    """The provider says the node's machine is gone (a deleted namespace, a terminated instance)."""

    node: str
    why: str


@dataclass(frozen=True)
class Stalled:
    """The stall watchdog saw no progress for STALL_TIMEOUT."""

    why: str


@dataclass(frozen=True)
class ReplacementReady:
    """A replacement asked for ``node`` is ready (``inventory``: the cluster with it; ``at``: when)."""

    node: str
    inventory: Any
    at: float


@dataclass(frozen=True)
class ReplacementRefused:
    """A replacement asked for ``node`` was refused or failed (why, in one line)."""

    node: str
    why: str


@dataclass(frozen=True)
class Retire:
    """The provider of noticed ``node``'s replacement waits to end the old machine until the run lets the node go
    (:mod:`multinode.app.stays`): ``ready``, the new machine was launched beside it and is ready to take its place;
    else the provider ends the old machine before it launches the new one."""

    node: str
    ready: bool = True


@dataclass(frozen=True)
class JobRecord:
    """A record of the job channel (:mod:`training.channel`) from ``node``'s output, that the loop acts on."""

    node: str
    kind: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Looked:
    """The run's look at the members that went silent while the others paused (look ``number`` of the attempt):
    ``named`` -- {node: why} of one whose ranks the stacks show frozen; ``answers`` -- {node: (answers SSH, its
    answer or why not)}."""

    number: int
    silent: tuple[str, ...]
    named: dict = field(default_factory=dict)
    answers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Unreachable:
    """The first part of look ``number``: the silent members whose SSH port takes no TCP connection (``nodes``:
    {node: why}) -- the kernel completes a handshake however busy the machine, so such a node's link or machine
    is gone."""

    number: int
    nodes: dict = field(default_factory=dict)


Event = NodeEnded | JobEnded | JobError | NodeGone | Stalled | ReplacementReady | ReplacementRefused | JobRecord | \
    Looked | Unreachable


class Events:
    """The attempt's queue: every part puts, only the attempt loop takes. ``take`` waits at most ``timeout``
    seconds (None: nothing came, the loop's tick)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.started = time.monotonic()

    def put(self, event: Event) -> None:
        self._queue.put(event)

    def take(self, timeout: float) -> Event | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
