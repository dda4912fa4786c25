"""What every drill shares: the repository's paths, the process-group timeout the drill jobs run with,
watching a CLI process's output as it runs, and finding a job's processes on a node."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PG_TIMEOUT = 10
# A hang guard on a whole CLI run: past the run's own STALL_TIMEOUT (300 s by default: multinode.core.config), its
# capture and its stop, so a run that stalls is ended -- and says so -- by its own watchdog, not by the test's wait.
RUN_BOUND = 600


class Watcher:
    def __init__(self, stream):
        self.lines: list[str] = []
        self.times: list[float] = []  # time.monotonic() at which each line arrived
        self.partner: "Watcher | None" = None  # the process's other stream (watched() pairs them)

        def read() -> None:
            for line in stream:
                self.times.append(time.monotonic())
                self.lines.append(line)

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30) -> None:
        """Until the stream's end has been read (the process has exited and closed it), with a deadline."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"output still open {timeout} s after the process exited")

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, re.Match] | None:
        """(arrival time, match) of the first line matching ``pattern`` that arrived after ``after``."""
        for when, line in zip(list(self.times), list(self.lines)):
            match = re.search(pattern, line)
            if when >= after and match:
                return when, match
        return None

    def wait_for(self, pattern: str, timeout: float = 120, also: "Watcher | None" = None) -> None:
        """Until a line matches ``pattern``; TimeoutError with the last lines (and those of ``also``, by default the
        process's other stream, where a refusal or a wait says why) when none did within ``timeout`` -- at once
        when the stream has ended without one (the process exited: a refusal at pre-flight waits out nothing)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ended = not self.thread.is_alive()  # read before the lines: every line came before the end
            if any(re.search(pattern, line) for line in list(self.lines)):
                return
            if ended:
                other = also or self.partner
                if other is not None:  # its last lines may still be on their way: its reader is a thread of its own
                    with contextlib.suppress(TimeoutError):
                        other.join(5)
                raise TimeoutError(f"no {pattern!r}: the output ended without it\n{self.tail(also)}")
            time.sleep(0.1)
        raise TimeoutError(f"no {pattern!r} within {timeout} s:\n{self.tail(also)}")

    def tail(self, also: "Watcher | None" = None, lines: int = 30) -> str:
        """The run's own lines (none of a node's: what it decided, from the start -- a failure seen only in a
        loaded CI run is explained by its early decisions, which the last lines no longer hold), the last ``lines``
        lines, and those of ``also`` (by default the process's other stream)."""
        also = also or self.partner
        own = [line for line in list(self.lines)[:-lines] if not line.startswith("[node-")][-2 * lines:]
        said = f"the run's own lines before them:\n{''.join(own)}...\n" if own else ""
        other = f"\nand on the other stream:\n{''.join(also.lines[-lines:])}" if also is not None else ""
        return f"{said}{''.join(self.lines[-lines:])}{other}"


@contextlib.contextmanager
def watched(proc: subprocess.Popen):
    """(out, err): Watchers of a CLI process's stdout and stderr. Leaving the block kills the process if it still
    runs; leaving it normally also waits until both streams have been read to their end. A ``proc.wait(timeout=...)``
    in the block that expires raises TimeoutError with the last lines of both streams (what the run was doing)."""
    out, err = Watcher(proc.stdout), Watcher(proc.stderr)
    out.partner, err.partner = err, out
    try:
        yield out, err
    except subprocess.TimeoutExpired as expired:
        _stop(proc)
        with contextlib.suppress(TimeoutError):
            out.join(10), err.join(10)
        raise TimeoutError(f"the process did not exit within {expired.timeout:g} s; its stdout:\n{out.tail()}") from None
    finally:
        _stop(proc)
    out.join(), err.join()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _proc_list(pid: int, what: str) -> list[bytes]:
    """``/proc/<pid>/<what>``'s NUL-separated entries; [] once the process has ended."""
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes().split(b"\0")
    except OSError:
        return []


def environ(pid: int) -> list[bytes]:
    """A process's environment as it was started (a shell's later ``export`` is not in it); [] once it has ended."""
    return _proc_list(pid, "environ")


def cmdline(pid: int) -> list[bytes]:
    return _proc_list(pid, "cmdline")


def find_pid(state, node: str, agent: bool, script: bytes = b"user_allreduce.py") -> int:
    """The pid of the job's torchrun agent (``agent``) or of its worker running ``script`` on ``node``."""
    from multinode.providers.local.faults import job_pids

    for pid in job_pids(state, node):
        cmd = cmdline(pid)
        is_agent = b"torch.distributed.run" in cmd
        if any(part.endswith(script) for part in cmd) and is_agent == agent:
            return pid
    raise RuntimeError(f"no {'torchrun agent' if agent else 'worker'} on {node}")
