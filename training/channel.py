"""The channel between a job and its run: every record a job sends, the files it keeps on its node for the run to
read, and what the run gives every rank (its environment, the membership it sends back, the exit code of a notice).

One module on both ends: the trainer, the ``training.preempt`` helpers of a user's script and the guard write
and read it; the orchestrator uses the same definitions (it imports this module as ``multinode.trainer.channel``,
the only module of the trainer it imports: tests/unit/test_layout.py holds it to that). Standard library only: a
user's script and the guard load it before anything else.

**Lines.** A record is one line on a rank's stdout, ``KIND {json}``, written in one ``write`` (``print`` writes the
text and its newline apart, and under ``python -u`` another rank's line can land between the two). The kinds:

=============  ===========  ==================================================================================
kind           who          payload
=============  ===========  ==================================================================================
``RESULT``     rank 0       how the job ended: workload, launcher, accuracy, ... (``training/train.py``)
``PREEMPTED``  rank 0       a notice's coordinated checkpoint: notice, where every rank stopped, the copies
``RESUMED``    rank 0       the snapshot a job continued from: step, epoch, world sizes, batch, whose
``MARK``       rank 0       the ledger's marks: first/progress/last step, a checkpoint's stall (:class:`Mark`)
``STEPTIMES``  every rank   a window of one rank's step times, compute and communication (:class:`StepTimes`)
``KEPT``       every node   a survivor kept the last completed step after a lost peer (:class:`Kept`)
``WORLD``      rank 0       the ranks went on in a new membership without a restart (:class:`World`); its
                            generation 0 says the job takes membership changes in its own processes
``JOINING``    a new rank   a rank the run started to join a running job is ready and waits in the rendezvous
``WAITING``    every rank   its step has run far past its typical step: maybe a peer gone without a word
                            (:mod:`training.waiting`; rank, host, step, seconds)
``NOTICE``     a rank       a spot interruption notice on its node, which it keeps training through until the
                            run writes a membership without the node or ``leave_by`` (:mod:`training.notice`)
``CHECKPOINT_UPLOADED``      rank 0   a checkpoint reached the bucket: url, bytes, sha256, order, seconds
``CHECKPOINT_UPLOAD_FAILED`` rank 0   a checkpoint did not: order, error (boto3's code and message)
=============  ===========  ==================================================================================

mpirun's ``--tag-output`` can glue the next chunk's tag (``[1,0]<stdout>:``) to a line written in two pieces;
:data:`LINE` allows it after the JSON (logs recorded before the runner re-assembled tagged lines hold such lines).

**Files** in the rank's run directory on its node (``<workdir>/runs/<run id>``):

* ``heartbeat-rank<R>`` (:func:`heartbeat_name`): the rank's optimizer step count as text, rewritten atomically at
  most once a second after a step or an evaluation batch; the stall watchdog reads its time, recovery its step;
* ``membership.json`` (:data:`MEMBERSHIP_FILE`, named to the ranks by :data:`MEMBERSHIP_ENV`): written by the RUN,
  read by the ranks (:mod:`training.membership`): the generation of the job's membership and who is in it
  (:class:`Membership`). The one record that goes the other way, over the run's SSH connection once per change,
  never per step.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import TextIO

RESULT, PREEMPTED, RESUMED, MARK, STEPTIMES, KEPT, WORLD, JOINING, WAITING, NOTICE = \
    "RESULT", "PREEMPTED", "RESUMED", "MARK", "STEPTIMES", "KEPT", "WORLD", "JOINING", "WAITING", "NOTICE"
UPLOADED, UPLOAD_FAILED = "CHECKPOINT_UPLOADED", "CHECKPOINT_UPLOAD_FAILED"
KINDS = (RESULT, PREEMPTED, RESUMED, MARK, STEPTIMES, KEPT, WORLD, JOINING, WAITING, NOTICE, UPLOADED,
         UPLOAD_FAILED)
LINE = re.compile(r"(?<![A-Z_])(" + "|".join(KINDS) + r") (\{.*\})(?:\[\d+,\d+\]<std(?:out|err)>:)?\s*$")

# --- what the run gives every rank ------------------------------------------------------------------------------
EXIT_PREEMPTED = 75  # a rank (or node) that stopped on a notice with its checkpoint: sysexits.h EX_TEMPFAIL, "retry"
# A rank whose collective failed with nothing of its own wrong -- a peer gone, or slower than the process-group
# timeout -- its last step kept where it could be: sysexits.h EX_PROTOCOL, "remote error in protocol". RECOVER starts
# every process again when no node exited any other way (multinode.app.decide).
EXIT_PEER_FAILED = 76
RUN_ID_ENV = "MULTINODE_RUN_ID"  # every process of the run carries it (the sweep and the watchdog find them by it)
GRACE_ENV = "MULTINODE_GRACE"  # SIGTERM is a notice; seconds until SIGKILL (docs/preemption.md)
NOTICES_ENV = "MULTINODE_NOTICES"  # off: no notice source at all
NOTICE_POLL_ENV = "MULTINODE_NOTICE_POLL"  # seconds between metadata polls (AWS's 5 s without it)
NOTICE_MARGIN_ENV = "MULTINODE_NOTICE_MARGIN"  # seconds before a notice's action time noticed ranks leave (30)
PREEMPT_MARK_ENV = "MULTINODE_PREEMPT_MARK"  # the guard's note that its command ended preempted (torchrun hides 75)
GUARD_ENV = "MULTINODE_GUARD"  # set for training.guard's own process only (it starts its command without it)
CHECKPOINT_URL_ENV = "MULTINODE_CHECKPOINT_URL"  # the bucket every rank 0 uploads its checkpoints to
MEMBERSHIP_ENV = "MULTINODE_MEMBERSHIP"  # where the run writes membership.json: the job may change it in-process
SURVIVOR_ENV = "MULTINODE_SURVIVOR"  # "0": no snapshot of the last step on a lost peer (a baseline trainer)

HEARTBEAT_PREFIX = "heartbeat-rank"
MEMBERSHIP_FILE = "membership.json"


@dataclass(frozen=True)
class Record:
    """One line of the channel: its kind and its JSON payload."""

    kind: str
    data: dict


def line(kind: str, payload: dict) -> str:
    """The record as its line (newline included)."""
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; one of {', '.join(KINDS)}")
    return f"{kind} {json.dumps(payload)}\n"


def send(kind: str, payload: dict, out: TextIO | None = None) -> None:
    """Write the record to ``out`` (stdout) in one write, flushed."""
    out = out or sys.stdout
    out.write(line(kind, payload))
    out.flush()


def parse(text: str) -> Record | None:
    """The record a line holds, or None (not a record, or its JSON does not parse to an object)."""
    match = LINE.search(text)
    if match is None:
        return None
    try:
        data = json.loads(match[2])
    except json.JSONDecodeError:
        return None
    return Record(match[1], data) if isinstance(data, dict) else None


def every(lines, kind: str) -> list[dict]:
    """The payloads of every ``kind`` record in ``lines``, in order."""
    return [rec.data for rec in map(parse, lines) if rec is not None and rec.kind == kind]


def last(lines, kind: str) -> dict | None:
    """The payload of the last ``kind`` record in ``lines`` that parses, if any."""
    for text in reversed(list(lines)):
        rec = parse(text)
        if rec is not None and rec.kind == kind:
            return rec.data
    return None


# --- the records with a fixed shape --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """A ledger mark (``training/marks.py``): ``mark`` is first_step | steps | last_step | checkpoint; ``at`` Unix
    seconds; a checkpoint's ``seconds`` of stall and ``kind`` (periodic | coordinated)."""

    mark: str
    at: float
    step: int | None = None
    seconds: float | None = None
    kind: str | None = None

    def payload(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def read(cls, data: dict) -> "Mark | None":
        if not isinstance(data.get("mark"), str) or not isinstance(data.get("at"), (int, float)):
            return None
        step = data.get("step")
        seconds = data.get("seconds")
        return cls(data["mark"], float(data["at"]), step if isinstance(step, int) else None,
                   float(seconds) if isinstance(seconds, (int, float)) else None,
                   data.get("kind") if isinstance(data.get("kind"), str) else None)


@dataclass(frozen=True)
class StepTimes:
    """One window of one rank's steps (``training/steptimes.py``): medians in milliseconds."""

    rank: int
    steps: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    world: int | None = None  # the ranks the window's steps ran on (a membership change starts a new window)
    step: int | None = None  # the training's step the window ended at (None: a trainer that does not say)
    step_mean_ms: float | None = None  # the means (what the steps took in all: steps x mean); None: not said
    compute_mean_ms: float | None = None

    @classmethod
    def read(cls, data: dict) -> "StepTimes | None":
        try:
            world, step = data.get("world"), data.get("step")
            means = [None if data.get(k) is None else float(data[k]) for k in ("step_mean_ms", "compute_mean_ms")]
            return cls(int(data["rank"]), int(data["steps"]), float(data["step_ms"]), float(data["compute_ms"]),
                       float(data["comm_ms"]), None if world is None else int(world), None if step is None else int(step),
                       *means)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class Kept:
    """A survivor's kept step: after a lost peer (or a noticed one's departure), the first rank of a node holds the
    last completed step in memory and waits for the run's new membership; ``position`` is where that step left it
    (our trainer: [epoch, samples of it trained]; a user's loop: its own); ``why``: ``"lost"`` (a collective failed on
    a peer) or ``"leave"`` (the ranks agreed that the noticed nodes leave: they exit 75 by themselves)."""

    rank: int
    host: str
    step: int
    position: list = field(default_factory=list)
    in_memory: bool = False
    error: str = ""
    why: str = "lost"

    @classmethod
    def read(cls, data: dict) -> "Kept | None":
        try:
            return cls(int(data["rank"]), str(data["host"]), int(data["step"]), list(data.get("position") or []),
                       bool(data.get("in_memory", False)), str(data.get("error", "")), str(data.get("why", "lost")))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class World:
    """The ranks went on in membership ``generation`` at ``step`` without a restart: ``world_size`` ranks (from
    ``before``), ``seconds`` from the last step completed before a loss (or the agreed step) to the first step of the new world."""

    generation: int
    step: int
    world_size: int
    before: int
    seconds: float
    joined: list[str] = field(default_factory=list)  # hosts that joined in this generation
    left: list[str] = field(default_factory=list)  # hosts that left

    @classmethod
    def read(cls, data: dict) -> "World | None":
        try:
            return cls(int(data["generation"]), int(data["step"]), int(data["world_size"]), int(data["before"]),
                       float(data["seconds"]), list(data.get("joined", [])), list(data.get("left", [])))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Membership:
    """What the run tells the ranks (``membership.json`` on the nodes it concerns): generation ``generation`` of the
    job's membership is ``hosts`` (the nodes' host names, head first, each with ``nproc`` ranks); ``joining``: the
    hosts new in it. A rank whose host is not listed leaves; ranks on a host that is new join."""

    generation: int
    hosts: list[str]
    nproc: int
    joining: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.nproc

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Membership | None":
        try:
            data = json.loads(text)
            return cls(int(data["generation"]), [str(h) for h in data["hosts"]], int(data["nproc"]),
                       [str(h) for h in data.get("joining", [])])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None


def heartbeat_name(rank: int) -> str:
    """The heartbeat file of global rank ``rank`` in its run directory."""
    return f"{HEARTBEAT_PREFIX}{rank}"


def heartbeat_glob(directory: str) -> str:
    """A shell glob of every rank's heartbeat file in ``directory`` (a node's run directory)."""
    return f"{directory}/{HEARTBEAT_PREFIX}*"


def heartbeat_steps(text: str) -> list[int]:
    """The steps in heartbeat files' contents (``cat`` of several: one number per line)."""
    return [int(tok) for tok in text.split() if tok.isdigit()]
