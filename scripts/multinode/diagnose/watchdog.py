"""Stall watchdog (``STALL_TIMEOUT``): end a job that has stopped making progress, instead of waiting
for a process-group timeout that is 30 minutes in a user's script (gloo's default; NCCL's is 10).

Progress, polled every :func:`poll_interval` seconds:

* our trainer: its step heartbeat -- every rank touches ``<run dir>/heartbeat-rank<R>`` on its node (the job
  channel's file, :func:`training.channel.heartbeat_name`) after
  each optimizer step and evaluation batch (at most once a second). Once any heartbeat exists, only
  heartbeats count: a rank spinning in a wedged data loader burns CPU but makes no step.
* any script (no heartbeat): a new line of output from any node (the size of the run's local log files),
  or CPU time spent by the main thread of any rank (one small Python program over SSH on every node,
  finding the ranks as the gang-stop does).

When nothing moved for ``timeout`` seconds, the watchdog puts one :class:`~multinode.core.events.Stalled` (why) on
the attempt's events; the run's attempt loop then captures the stacks of every rank (multinode.diagnose.capture)
and stops the job as a failure naming the culprit. A round in which a node does not answer changes nothing (a lost
node is the loop's business).

Default: :data:`DEFAULT_STALL_TIMEOUT` = 300 s -- past torch's imports, data loading and a long evaluation
on a slow machine (those use CPU or print), well short of the collective timeouts; ``STALL_TIMEOUT=0`` turns
the watchdog off.
"""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from multinode.core.config import DEFAULT_STALL_TIMEOUT
from multinode.core.events import Events, Stalled
from multinode.trainer import channel

# argv: run id, heartbeat directory, heartbeat files' prefix. Prints "<main-thread CPU ticks of every rank> <newest heartbeat mtime or 0>".
PROGRESS = r'''
import glob, os, sys
run_id, beats, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
own = os.readlink("/proc/self/ns/net")
ticks = 0
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == os.getpid():
        continue
    try:
        env = open("/proc/%s/environ" % d, "rb").read().split(b"\0")
        if ("MULTINODE_RUN_ID=" + run_id).encode() not in env or os.readlink("/proc/%s/ns/net" % d) != own:
            continue
        if not any(e.startswith((b"RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMIX_RANK=")) for e in env):
            continue
        if b"MULTINODE_GUARD=1" in env:  # training.guard in front of a rank (GRACE): its CPU is not the rank's
            continue
        raw = open("/proc/%s/task/%s/stat" % (d, d)).read()
    except OSError:
        continue
    f = raw[raw.rindex(")") + 2:].split()
    ticks += int(f[11]) + int(f[12])
mtimes = [os.stat(p).st_mtime for p in glob.glob(os.path.join(beats, prefix + "*"))]
print(ticks, max(mtimes, default=0))
'''


def poll_interval(timeout: float) -> float:
    """A sixth of the timeout, between 1 and 15 s: detection within timeout + interval."""
    return max(1.0, min(15.0, timeout / 6))


@dataclass(frozen=True)
class Progress:
    """One poll: how far the job has come, as far as we can see."""

    output_bytes: int  # the run's local logs (every node's output lines)
    cpu_ticks: int  # main-thread CPU time of every rank on every node that answered
    heartbeat: float  # newest heartbeat mtime on any node (0: no heartbeat: not our trainer, or not stepping yet)

    @property
    def started(self) -> bool:
        """Whether any rank is running (has used CPU time, or beats): before that nothing can stall -- a job waits
        in a SLURM queue or for its launcher, bounded by DEADLINE, not by STALL_TIMEOUT."""
        return self.cpu_ticks > 0 or self.heartbeat > 0

    def moved_since(self, before: "Progress") -> bool:
        if self.heartbeat or before.heartbeat:
            return self.heartbeat != before.heartbeat
        return self.output_bytes != before.output_bytes or self.cpu_ticks != before.cpu_ticks


class StallTracker:
    """Pure: fed polls with their time, says since when nothing moved."""

    def __init__(self, timeout: float, now: float):
        self.timeout = timeout
        self.last: Progress | None = None
        self.since = now  # when progress was last seen (or the job started)

    def feed(self, progress: Progress | None, now: float) -> None:
        if progress is None:
            return  # a round without answers changes nothing
        if self.last is None or not progress.started or progress.moved_since(self.last):
            self.since = now
        self.last = progress

    def stalled(self, now: float) -> str | None:
        idle = now - self.since
        if idle < self.timeout:
            return None
        what = "step heartbeat" if self.last and self.last.heartbeat else "output or CPU time"
        return f"no rank made progress ({what}) for {idle:.0f} s (STALL_TIMEOUT={self.timeout:g})"


class StallWatchdog:
    """Polls every node in a daemon thread while a job runs; a stall is one event on the attempt's queue."""

    def __init__(self, runner, run_id: str, log_dir: Path, timeout: float, run_dirs: dict[str, str]):
        self.runner, self.run_id, self.log_dir = runner, run_id, log_dir
        self.run_dirs = run_dirs  # node -> the run's directory on that node (where heartbeats are)
        self.tracker = StallTracker(timeout, time.monotonic())
        self.interval = poll_interval(timeout)
        self.events: Events | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mn-stall-watchdog", daemon=True)

    def start(self, events: Events) -> None:
        """Poll from now on (the job is about to start: its startup counts as time without progress only if
        it prints nothing and uses no CPU); a stall goes on ``events`` once (:class:`~multinode.core.events.Stalled`)."""
        self.events = events
        self.tracker.since = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def stalled(self) -> str | None:
        return self.tracker.stalled(time.monotonic())

    def _poll(self) -> Progress | None:
        python = self.runner.inventory.python
        commands = {node: shlex.join([python, "-c", PROGRESS, self.run_id, run_dir, channel.HEARTBEAT_PREFIX])
                    for node, run_dir in self.run_dirs.items()}
        answers = self.runner.run_each(commands, timeout=max(5.0, self.interval))
        ticks, beat, answered = 0, 0.0, 0
        for res in answers.values():
            try:
                node_ticks, node_beat = res.stdout.split()
            except ValueError:
                continue
            ticks, beat, answered = ticks + int(node_ticks), max(beat, float(node_beat)), answered + 1
        if not answered:
            return None
        output = sum(p.stat().st_size for p in self.log_dir.glob("*.log"))
        return Progress(output, ticks, beat)

    def _loop(self) -> None:
        polled = time.monotonic()
        while not self._stop.wait(min(1.0, self.interval)):
            if time.monotonic() - polled >= self.interval:
                polled = time.monotonic()  # what a poll sees is as of when it asked, not when the slowest node answered
                try:
                    progress = self._poll()
                except Exception:  # a poll that fails is a round without answers
                    progress = None
                self.tracker.feed(progress, polled)
            why = self.stalled()
            if why is not None:
                self.events.put(Stalled(why))
                return


__all__ = ["DEFAULT_STALL_TIMEOUT", "Progress", "StallTracker", "StallWatchdog", "poll_interval"]
