"""Notices: what a rank (or the guard) hears of a coming stop, and the agreement that turns one rank's notice into
the same step on every rank. The machinery behind :mod:`training.preempt` (a user script's helpers) and
:mod:`training.guard`; standard library only (torch is imported inside :func:`torch_all_reduce_max`), so the guard's
private copy on a node needs nothing else (:data:`multinode.plan.launchers.base.GUARD_FILES`).

Notice sources (one :class:`Watcher` per process, :func:`watch`; docs/preemption.md): the instance metadata service
(:mod:`training.imds`: a spot interruption stops, a rebalance recommendation saves and goes on), polled every 5 s
(AWS's advice; ``MULTINODE_NOTICE_POLL``) where its endpoint variable is set or on EC2; SIGTERM when
``MULTINODE_GRACE=<seconds>`` is set (the rank then has that long; without it SIGTERM keeps its default).
``MULTINODE_NOTICES=off`` turns both off. A notice older than this process is ignored, said in one line.

Agreement (:class:`Agreement`): every ``k`` steps each rank all-reduces ``[notice here?, seconds per step]``
with MAX (1 a notice that stops, 0.5 a rebalance not yet saved for, 0 none): a notice seen by any rank is seen by
all at the same step (a stop wins over a save), and the next ``k`` (about one check a second) is the same on every
rank. No other communication; a notice costs at most one check interval; the snapshot holds every step taken.

Staying (a job whose membership the run changes: ``members``): a spot interruption notice does not stop the noticed
ranks at once. They say ``NOTICE`` (once per process) and train on, so the run can launch the replacement beside
the noticed machine; they leave when the run writes a membership without their node (the agreement's ``"reform"``)
or by themselves at the action time less :data:`STAY_MARGIN` (``MULTINODE_NOTICE_MARGIN``; ``"leave"``, or
``"stop"`` for every rank when rank 0's node is noticed: its coordinated checkpoint). A SIGTERM with a grace, and
any notice of a job without members, stops as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

from . import channel, imds  # relative: the same file runs as training.notice and in the guard's private copy

EXIT_PREEMPTED = channel.EXIT_PREEMPTED
GRACE_ENV = channel.GRACE_ENV
SWITCH_ENV = channel.NOTICES_ENV
POLL_ENV = channel.NOTICE_POLL_ENV  # seconds between metadata polls (default imds.POLL_SECONDS, AWS's advice)
MARGIN_ENV = channel.NOTICE_MARGIN_ENV
CHECK_SECONDS = 1.0  # target time between agreement checks
STAY_MARGIN = 30.0  # s before the action time (module doc): a check, a head's checkpoint, the stop; AWS gives 120
MAX_CHECK_STEPS = 1000

log = logging.getLogger("training")


class Watcher:
    """A process's notices: the metadata service polled on a thread, SIGTERM caught (each if enabled). ``notice``
    is the first that stops the job; ``rebalance`` a rebalance recommendation not yet taken (:meth:`take_rebalance`)."""

    def __init__(self, client: imds.MetadataClient | None, grace: float | None, poll: float = imds.POLL_SECONDS,
                 started: float | None = None, margin: float = STAY_MARGIN):
        self.client, self.grace, self.poll, self.margin = client, grace, poll, margin
        self.started = imds.process_started() if started is None else started  # notices before it are not this run's
        self.notice: imds.Notice | None = None
        self.noticed_at: float | None = None  # time.time() when this process first saw it
        self.rebalance: imds.Notice | None = None  # a recommendation not yet saved for
        self.signalled = False  # a SIGTERM came (with a grace: the guard's, or a stop's): no staying on then
        self._known: set[tuple[str, str | None]] = set()  # rebalances taken and stale notices told, once each
        self._event = threading.Event()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self.client is not None or self.grace is not None

    def start(self) -> Watcher:
        if self.grace is not None:
            signal.signal(signal.SIGTERM, self._on_signal)
        if self.client is not None:
            self.thread = threading.Thread(target=self._loop, name="spot-notice-watcher", daemon=True)
            self.thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def note(self, notice: imds.Notice) -> None:
        """Record the first notice that stops (later ones add nothing: one checkpoint is enough); a rebalance
        recommendation once per its time (the service shows it until the instance goes)."""
        if not notice.stops:
            if (notice.kind, notice.time) not in self._known:
                self._known.add((notice.kind, notice.time))
                self.rebalance = notice
            return
        if self.notice is None:
            self.notice, self.noticed_at = notice, time.time()
            self._event.set()

    def requested(self) -> bool:  # whether this process has a notice that stops the job
        return self._event.is_set()

    def take_rebalance(self) -> imds.Notice | None:
        """The rebalance recommendation not yet saved for, if any; it is then taken."""
        notice, self.rebalance = self.rebalance, None
        return notice

    def stale(self, notice: imds.Notice) -> bool:
        """Whether ``notice`` is older than this process (its time before :attr:`started`): said once, ignored."""
        if not notice.older_than(self.started):
            return False
        if ("stale", notice.time) not in self._known:
            self._known.add(("stale", notice.time))
            log.warning("ignoring a %s: it is older than this run (started %s)", notice.describe(),
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)))
        return True

    def wait(self, timeout: float) -> bool:  # until a notice (True) or ``timeout`` seconds (False)
        return self._event.wait(timeout)

    def seconds_left(self) -> float | None:
        """Until this rank is killed, when a SIGTERM with a grace is the notice; None otherwise."""
        if self.notice is None or self.notice.kind != "signal" or self.grace is None:
            return None
        return self.noticed_at + self.grace - time.time()

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True
        self.note(imds.Notice("signal", signal.Signals(signum).name, time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                   time.gmtime()), "signal"))

    def _loop(self) -> None:
        while not self._stop.is_set() and not self._event.is_set():
            try:
                notice = self.client.poll()
            except (OSError, imds.BadNotice):
                notice = None  # not reachable (yet): no notice; keep looking
            if notice is not None and not self.stale(notice):
                self.note(notice)  # a stop ends the loop; a rebalance does not (the interruption may follow)
            self._stop.wait(self.poll)


_WATCHER: Watcher | None = None


def grace_from_env(env=None) -> float | None:
    """MULTINODE_GRACE: a rank's seconds between SIGTERM and SIGKILL (None: SIGTERM keeps its default)."""
    return _seconds(os.environ if env is None else env, GRACE_ENV, None, 60)


def poll_from_env(env=None) -> float:
    """MULTINODE_NOTICE_POLL: seconds between the metadata service's polls (a local cluster's drills poll faster
    than the 5 s AWS advises)."""
    return _seconds(os.environ if env is None else env, POLL_ENV, imds.POLL_SECONDS, 5)


def margin_from_env(env=None) -> float:  # MULTINODE_NOTICE_MARGIN (module doc)
    return _seconds(os.environ if env is None else env, MARGIN_ENV, STAY_MARGIN, 60)


def _seconds(env, name: str, default: float | None, example: int) -> float | None:
    """A positive number of seconds from ``env[name]`` (``default`` when unset); ValueError with the fix."""
    text = env.get(name)
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds, e.g. {name}={example}") from None
    if not seconds > 0:
        raise ValueError(f"{name}={text!r} must be a positive number of seconds, e.g. {name}={example}")
    return seconds


def notices_off(env) -> bool:
    """``MULTINODE_NOTICES=off`` (or ``0``, ``no``): no notice source at all."""
    return env.get(SWITCH_ENV, "").lower() in ("off", "0", "no")


def reads_metadata(env) -> bool:
    """Whether to poll the metadata service: notices not off, and its endpoint variable set or on EC2."""
    return not notices_off(env) and (bool(env.get(imds.ENDPOINT_ENV)) or imds.on_ec2())


def watch(env=None) -> Watcher:
    """This process's watcher, started on the first call with the sources the environment enables."""
    global _WATCHER
    if _WATCHER is None:
        env = os.environ if env is None else env
        off = notices_off(env)
        client = imds.MetadataClient(imds.endpoint(env)) if reads_metadata(env) else None
        _WATCHER = Watcher(client, None if off else grace_from_env(env), poll_from_env(env),
                           margin=margin_from_env(env)).start()
    return _WATCHER


def requested() -> bool:
    """Whether this process has seen a notice (starts the watcher on first use)."""
    return watch().requested()


class Members:
    """What the agreement carries for a job whose membership can change while it runs (:mod:`training.membership`):
    this rank's place (``rank`` of ``world_size``) and the newest membership generation written on its node."""

    def __init__(self, rank: int, world_size: int, newest) -> None:
        self.rank, self.world_size, self.newest = rank, world_size, newest  # newest() -> int
        self.generation = 0  # the generation the ranks are in


class Agreement:
    """Every rank calls :meth:`check` (or :meth:`step`) after each optimizer step; the answer is the same on every
    rank at every step: ``"stop"`` once any rank has a notice that stops, ``"save"`` once any rank has a rebalance
    recommendation (and none a stop), else None. ``all_reduce_max(list) -> list`` is the job's collective (MAX).

    With ``members`` (a job whose membership the run may change), the same all-reduce also carries which ranks have a
    notice and the newest membership generation any rank has seen: ``"leave"`` -- the noticed ranks (:attr:`leaving`)
    leave and the others go on without them, unless rank 0 is among them (it hosts the job's store: then ``"stop"``
    for all, as without members); ``"reform"`` -- the run wrote a newer generation (:attr:`generation`): every rank
    changes to it at this step. The check is still one all-reduce, of ``2 + 1 + world size`` numbers."""

    def __init__(self, watcher: Watcher, all_reduce_max, members: Members | None = None):
        self.watcher, self.all_reduce_max, self.members = watcher, all_reduce_max, members
        self.steps = 0
        self.next_check = 1
        self._since = time.perf_counter()
        self._since_steps = 0
        self.stopped_at: int | None = None
        self.saved_at: list[int] = []  # the steps a rebalance recommendation was saved at
        self.rebalance: imds.Notice | None = None  # this rank's recommendation at the last "save", if it had one
        self.leaving: list[int] = []  # "leave": the ranks with a notice
        self.generation = 0  # "reform": the generation every rank changes to
        self.stay_told = False  # this rank said NOTICE (:meth:`stays`)

    def restart(self, members: Members | None) -> None:  # after a membership change: a fresh count
        self.members, self.steps, self.next_check = members, 0, 1
        self._since, self._since_steps = time.perf_counter(), 0

    def check(self) -> str | None:
        self.steps += 1
        if not (self.watcher.active or self.members is not None) or self.steps < self.next_check:
            return None
        now = time.perf_counter()
        per_step = (now - self._since) / max(self.steps - self._since_steps, 1)
        stop = self.watcher.requested() and not self.stays()
        rebalance = None if stop else self.watcher.take_rebalance()
        values = [1.0 if stop else 0.5 if rebalance else 0.0, per_step]
        members = self.members
        if members is not None:
            values += [float(members.newest())] + [1.0 if stop and r == members.rank else 0.0
                                                    for r in range(members.world_size)]
        reduced = self.all_reduce_max(values)
        flag, per_step = reduced[0], reduced[1]
        self._since, self._since_steps = now, self.steps
        self.next_check = self.steps + max(1, min(MAX_CHECK_STEPS, int(CHECK_SECONDS / max(per_step, 1e-6))))
        if flag >= 1.0:
            noticed = [r for r, f in enumerate(reduced[3:]) if f >= 1.0]
            if members is not None and noticed and 0 not in noticed:
                self.leaving = noticed
                return "leave"
            self.stopped_at = self.steps
            if not self.watcher.requested():
                self.watcher.note(imds.Notice("peer", None, None, "another rank"))
            return "stop"
        if members is not None and reduced[2] > members.generation:
            self.generation = int(reduced[2])
            return "reform"
        if flag > 0:
            self.saved_at.append(self.steps)
            self.rebalance = rebalance
            return "save"
        return None

    def stays(self) -> bool:
        """Whether this rank's notice lets it keep training for now (module doc: an interruption notice, members,
        before its action time less the watcher's margin); the first time, ``NOTICE`` to the run."""
        notice, members = self.watcher.notice, self.members
        if members is None or notice is None or notice.kind != "interruption" or self.watcher.signalled:
            return False
        leave_by = (notice.epoch() or self.watcher.noticed_at + 120.0) - self.watcher.margin  # AWS: two minutes
        if time.time() >= leave_by:
            return False
        if not self.stay_told:
            self.stay_told = True
            log.warning("%s: training on until the run lets this node go (at the latest %s)", notice.describe(),
                        time.strftime("%H:%M:%SZ", time.gmtime(leave_by)))
            channel.send(channel.NOTICE, {"rank": members.rank, "time": notice.time, "leave_by": round(leave_by, 3)})
        return True

    def step(self) -> bool:
        """:meth:`check` for a loop that only stops: True on ``"stop"``."""
        return self.check() == "stop"


def torch_all_reduce_max(device=None):
    """``all_reduce_max`` over torch.distributed when a process group exists, else identity."""
    import torch
    import torch.distributed as dist

    def reduce(values: list[float]) -> list[float]:
        if not (dist.is_available() and dist.is_initialized()):
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device or "cpu")
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.cpu().tolist()

    return reduce
