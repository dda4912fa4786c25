"""Stop signals: while a job runs, Ctrl-C, SIGTERM and SIGHUP are recorded and acted on by the watch loop
(:class:`StopSignals`); around the whole command, outside a job, each of them interrupts it (:class:`Interrupts`)."""

from __future__ import annotations

import signal
import threading
from typing import Any

from multinode.core.errors import Interrupted


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Handled:
    """Ctrl-C, SIGTERM and SIGHUP go to :meth:`handle` inside the block, and back to what they were after it.
    Outside the main thread signals cannot be caught, and nothing changes."""

    SIGNALS = SIGNALS

    def handle(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self.handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class Interrupts(_Handled):
    """For the whole command: Ctrl-C, SIGTERM and SIGHUP raise KeyboardInterrupt wherever the main thread is
    (pre-flight, the code and data sync, SETUP, between attempts), so the steps' cleanup runs -- a node's sync
    stopped, the claim given back, the connections closed -- and the command exits 130 (Ctrl-C), 143 or 129.
    Without it a SIGTERM (a CI job's timeout, ``kill``) would end the command on the spot, and a Ctrl-C is
    lost when the command was started with SIGINT ignored (a shell's background job): Python then installs no
    handler of its own. A job's :class:`StopSignals` records them instead while it runs, and gives them back."""

    def handle(self, signum: int, frame: Any) -> None:
        raise Interrupted(signum)


class StopRequested(Exception):
    """A stop signal arrived while a job ran (see :class:`StopSignals`)."""


class StopSignals(_Handled):
    """While a job runs, Ctrl-C, SIGTERM and SIGHUP (a closed terminal) only record themselves; the
    run's watch loop reads that between events and stops the job on every node, as Ctrl-C does.
    A KeyboardInterrupt raised at an arbitrary point could leave the event queue's or the output's
    lock held and hang the gang-stop that follows; a default SIGTERM would leave the job running on
    every node. A second signal does not cut the gang-stop short (LOST_GRACE bounds it)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
