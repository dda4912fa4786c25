"""Stop signals while a job runs: Ctrl-C, SIGTERM and SIGHUP recorded, acted on by the watch loop."""

from __future__ import annotations

import signal
import threading
from typing import Any

class StopRequested(Exception):
    """A stop signal arrived while a job ran (see :class:`StopSignals`)."""


class StopSignals:
    """While a job runs, Ctrl-C, SIGTERM and SIGHUP (a closed terminal) only record themselves; the
    run's watch loop reads that between events and stops the job on every node, as Ctrl-C does.
    A KeyboardInterrupt raised at an arbitrary point could leave the event queue's or the output's
    lock held and hang the gang-stop that follows; a default SIGTERM would leave the job running on
    every node. A second signal does not cut the gang-stop short (LOST_GRACE bounds it). Outside the
    main thread signals cannot be caught, and nothing changes."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._record) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
