"""What the spot day watches from outside the orchestrator, on one local cluster: every instance's life (the
node-seconds paid) and the trainer's sample log on every node (the work done, with the time each step was seen).

* :class:`Instances`: a node's instance is its network namespace (the same name across replacements, a new
  namespace each time: its inode tells them apart), or, where the replay brings a taken node back in the same
  namespace (:meth:`Instances.take`, :meth:`Instances.back`), each of its lives. One is paid from its start --
  back-dated to its launch (the local provider's note of when its replacement's launch began, ``launched-<node>``;
  else the launch time the replay gave it, ``booting``: the namespace is made only once the launch -- and, beside a
  noticed node, that node's stay -- is over, an EC2 instance is paid from its launch) -- to its end, or the end of
  the run.
* :class:`SampleLog`: rank 0 appends one line per optimizer step to ``runs/<id>/samples.jsonl`` in its node's work
  directory (``training/runlog.py``); a new head (a node replaced, a cluster made again) starts a new file. Every
  node's file is read as it grows (every :data:`POLL` s, and on demand: before the replay takes a node away), each
  new line kept with the time it was seen, so a head that vanishes takes nothing with it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from multinode.providers.local.faults import launched_at

POLL = 0.5


def namespace_id(name: str) -> tuple[int, int] | None:
    """The identity of the network namespace ``name`` (None: there is none)."""
    try:
        found = os.stat(f"/run/netns/{name}")
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


@dataclass
class Instance:
    node: int
    ident: tuple[int, int, int]
    paid_from: float  # monotonic
    ended: float | None = None


@dataclass
class Instances:
    """Every instance of the cluster's nodes, polled from their namespaces (module doc)."""

    names: list[str]  # the namespace of each node index
    booting: dict[int, float] = field(default_factory=dict)  # node -> seconds its next instance took to launch
    seen: list[Instance] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)  # nodes taken whose namespace stays (Instances.take)
    lives: dict[int, int] = field(default_factory=dict)  # node -> how many times it came back in its namespace
    provider_dir: Path | None = None  # where the local provider notes its launches (faults.note_launch)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, node: int) -> None:
        """The node's instance is gone, though its namespace stays (the replay brings it back there)."""
        with self._lock:
            self.taken.add(node)
            self._poll(time.monotonic())

    def back(self, node: int, booting: float) -> None:
        """A new instance of ``node`` in its namespace, launched ``booting`` seconds ago."""
        with self._lock:
            self.taken.discard(node)
            self.lives[node] = self.lives.get(node, 0) + 1
            self.booting[node] = booting
            self._poll(time.monotonic())

    def ident(self, node: int) -> tuple[int, int, int] | None:
        found = namespace_id(self.names[node])
        return None if found is None or node in self.taken else (*found, self.lives.get(node, 0))

    def poll(self, now: float | None = None) -> None:
        with self._lock:
            self._poll(time.monotonic() if now is None else now)

    def _poll(self, now: float) -> None:
        for node in range(len(self.names)):
            ident = self.ident(node)
            live = self.current(node)
            if live is not None and live.ident != ident:
                live.ended = now
                live = None
            if live is None and ident is not None:
                booting = self.booting.pop(node, 0.0)
                launched = None if self.provider_dir is None else launched_at(self.provider_dir, f"node-{node}")
                self.seen.append(Instance(node, ident, now - (time.time() - launched if launched else booting)))

    def current(self, node: int) -> Instance | None:
        return next((i for i in reversed(self.seen) if i.node == node and i.ended is None), None)

    def close(self, now: float) -> None:
        for instance in self.seen:
            if instance.ended is None:
                instance.ended = now

    def paid(self, start: float, end: float) -> float:
        """Node-seconds paid between ``start`` and ``end`` (monotonic)."""
        return sum(max(0.0, min(i.ended or end, end) - max(i.paid_from, start)) for i in self.seen)


@dataclass
class SampleLog:
    """Every node's ``samples.jsonl`` of one run id, read as it grows (module doc)."""

    files: list[Path]  # per node index
    lines: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time seen, line)
    _at: dict[int, tuple[tuple[int, bytes], int]] = field(default_factory=dict)  # node -> (its file, offset read)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def poll(self) -> None:
        with self._lock:
            now = time.monotonic()
            for node, path in enumerate(self.files):
                try:
                    with open(path, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        first = fh.readline()
                        # A file is its inode and its first line: a new head's file may get a freed inode again.
                        ident = (os.fstat(fh.fileno()).st_ino, first if first.endswith(b"\n") else b"")
                        known, offset = self._at.get(node, (ident, 0))
                        offset = offset if known == ident and offset <= size else 0
                        fh.seek(offset)
                        data = fh.read()
                except OSError:
                    continue
                whole = data[:data.rfind(b"\n") + 1]  # a line being written is read once it is whole
                self._at[node] = (ident, offset + len(whole))
                self.lines += [(now, line) for line in whole.decode().splitlines() if line.strip()]


class Watch:
    """Both watchers on one thread, every POLL s, until :meth:`stop`."""

    def __init__(self, instances: Instances, samples: SampleLog) -> None:
        self.instances, self.samples = instances, samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotday-watch", daemon=True)

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def poll(self) -> None:
        self.samples.poll()
        self.instances.poll()

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.poll()
