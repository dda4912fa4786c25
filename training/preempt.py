"""Preemption: a notice on any node becomes one checkpoint that every rank takes at the same step.

Notice sources (one watcher per process, started by :func:`watch`):

* the instance metadata service (:mod:`training.imds`): a spot interruption notice or a rebalance
  recommendation. Polled on a daemon thread every 5 s (AWS's advice; ``MULTINODE_NOTICE_POLL=<seconds>``
  changes it) when ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` is set (the local provider's nodes serve it at the EC2
  address) or the machine is an EC2 instance;
* SIGTERM (a scheduler, ``docker stop``, SLURM's ``--signal``) when ``MULTINODE_GRACE=<seconds>`` is set:
  the rank then has that long before it is killed. Without it SIGTERM keeps its default (the process ends),
  so jobs that never asked for this behave as before.
``MULTINODE_NOTICES=off`` turns both off.

Agreement (:class:`Agreement`): every ``k`` steps each rank all-reduces ``[notice here?, seconds per step]``
with MAX -- one 2-number collective, so a notice seen by any rank is seen by all at the same step, and the
next ``k`` (from the same reduced step time, about one check a second) is the same on every rank. Between
checks there is no extra communication. A notice costs at most one check interval of reaction; no work is
lost: the snapshot holds every step taken.

The exit status of a preempted rank is :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL`` of sysexits.h: "a
temporary failure; retry later") -- not a failure. A user script::

    from training import preempt
    with preempt.guard() as stop:
        for step in range(start, steps):
            train_one_step()
            if stop.now():            # every rank, same step
                save_checkpoint(step + 1)
                sys.exit(preempt.EXIT_PREEMPTED)

``preempt.requested()`` says whether this process has seen a notice (no agreement: for one-process scripts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

from . import imds  # relative: the same file runs as training.preempt and as the guard's private copy

EXIT_PREEMPTED = 75
GRACE_ENV = "MULTINODE_GRACE"
SWITCH_ENV = "MULTINODE_NOTICES"
POLL_ENV = "MULTINODE_NOTICE_POLL"  # seconds between metadata polls (default imds.POLL_SECONDS, AWS's advice)
CHECK_SECONDS = 1.0  # target time between agreement checks
MAX_CHECK_STEPS = 1000

log = logging.getLogger("training")


class Watcher:
    """A process's notices: the metadata service polled on a thread, SIGTERM caught (each if enabled)."""

    def __init__(self, client: imds.MetadataClient | None, grace: float | None, poll: float = imds.POLL_SECONDS):
        self.client, self.grace, self.poll = client, grace, poll
        self.notice: imds.Notice | None = None
        self.noticed_at: float | None = None  # time.time() when this process first saw it
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
        """Record the first notice (later ones add nothing: one checkpoint is enough)."""
        if self.notice is None:
            self.notice, self.noticed_at = notice, time.time()
            self._event.set()

    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Until a notice (True) or ``timeout`` seconds (False)."""
        return self._event.wait(timeout)

    def seconds_left(self) -> float | None:
        """Until this rank is killed, when a SIGTERM with a grace is the notice; None otherwise."""
        if self.notice is None or self.notice.kind != "signal" or self.grace is None:
            return None
        return self.noticed_at + self.grace - time.time()

    def _on_signal(self, signum, frame) -> None:
        self.note(imds.Notice("signal", signal.Signals(signum).name, time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                   time.gmtime()), "signal"))

    def _loop(self) -> None:
        while not self._stop.is_set() and not self._event.is_set():
            try:
                notice = self.client.poll()
            except (OSError, imds.BadNotice):
                notice = None  # not reachable (yet): no notice; keep looking
            if notice is not None:
                self.note(notice)
                return
            self._stop.wait(self.poll)


_WATCHER: Watcher | None = None


def grace_from_env(env=None) -> float | None:
    env = os.environ if env is None else env
    text = env.get(GRACE_ENV)
    if not text:
        return None
    try:
        grace = float(text)
    except ValueError:
        raise ValueError(f"{GRACE_ENV}={text!r} is not a number of seconds, e.g. {GRACE_ENV}=60") from None
    if grace <= 0:
        raise ValueError(f"{GRACE_ENV}={text!r} must be a positive number of seconds")
    return grace


def poll_from_env(env=None) -> float:
    """MULTINODE_NOTICE_POLL: seconds between the metadata service's polls (a local cluster's drills poll faster
    than the 5 s AWS advises); ValueError with the fix when it is not a positive number."""
    env = os.environ if env is None else env
    text = env.get(POLL_ENV)
    if not text:
        return imds.POLL_SECONDS
    try:
        poll = float(text)
    except ValueError:
        raise ValueError(f"{POLL_ENV}={text!r} is not a number of seconds, e.g. {POLL_ENV}=5") from None
    if not poll > 0:
        raise ValueError(f"{POLL_ENV}={text!r} must be a positive number of seconds, e.g. {POLL_ENV}=5")
    return poll


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
        _WATCHER = Watcher(client, None if off else grace_from_env(env), poll_from_env(env)).start()
    return _WATCHER


def requested() -> bool:
    """Whether this process has seen a notice (starts the watcher on first use)."""
    return watch().requested()


class Agreement:
    """Every rank calls :meth:`step` after each optimizer step; it returns True on the same step on all
    ranks once any rank has a notice. ``all_reduce_max(list) -> list`` is the job's collective (MAX)."""

    def __init__(self, watcher: Watcher, all_reduce_max):
        self.watcher, self.all_reduce_max = watcher, all_reduce_max
        self.steps = 0
        self.next_check = 1
        self._since = time.perf_counter()
        self._since_steps = 0
        self.stopped_at: int | None = None

    def step(self) -> bool:
        self.steps += 1
        if not self.watcher.active or self.steps < self.next_check:
            return False
        now = time.perf_counter()
        per_step = (now - self._since) / max(self.steps - self._since_steps, 1)
        flag, per_step = self.all_reduce_max([1.0 if self.watcher.requested() else 0.0, per_step])
        self._since, self._since_steps = now, self.steps
        self.next_check = self.steps + max(1, min(MAX_CHECK_STEPS, int(CHECK_SECONDS / max(per_step, 1e-6))))
        if flag > 0:
            self.stopped_at = self.steps
            if not self.watcher.requested():
                self.watcher.note(imds.Notice("peer", None, None, "another rank"))
            return True
        return False


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


class _Guard:
    def __init__(self, agreement: Agreement, marks=None):
        self.agreement = agreement
        self.watcher = agreement.watcher
        self.marks = marks  # the ledger's step marks (training/marks.py)

    def now(self) -> bool:
        """Call after every step on every rank: True on the same step everywhere once any rank has a notice.
        Each call is also a step of the run's ledger (:mod:`training.marks`: rank 0 marks the first one)."""
        if self.marks is not None:
            self.marks.step(self.agreement.steps + 1)
        return self.agreement.step()

    def requested(self) -> bool:
        return self.watcher.requested()


@contextlib.contextmanager
def guard(device=None):
    """The watcher and the agreement for a user's loop (see the module docstring); its steps are the ledger's
    when ``training/marks.py`` is beside this file (a project that copied only preempt.py and imds.py goes without)."""
    try:
        from . import marks  # not at the top: the notice guard's private copy has no marks.py
    except ImportError:
        marks = None
    watcher = watch()
    try:
        yield _Guard(Agreement(watcher, torch_all_reduce_max(device)), marks.current() if marks else None)
    finally:
        watcher.close()
