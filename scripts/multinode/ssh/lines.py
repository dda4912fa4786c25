"""Whole lines from a node's byte stream: what a job's output becomes on the console and in the per-node logs.

Concurrent writers on one pipe interleave mid-line; :class:`LineSink` re-assembles each node's stdout and stderr
into whole lines, writes them to the node's log file and, prefixed ``[node-i]`` (or relabeled, e.g. by mpirun's
rank tags), to the console under one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

Relabel = Callable[[str, str], tuple[str, str]]
"""(node the line arrived from, line) -> (node it belongs to, line to show); e.g. mpirun's rank tags."""


class LineSink:
    """File-like target of one node's stdout or stderr: emits whole lines only."""

    def __init__(self, node: str, lock: threading.Lock, log_file: TextIO | None, out: TextIO | None, tail: deque,
                 relabel: Relabel | None = None):
        self.node, self.lock, self.log_file, self.out, self.tail = node, lock, log_file, out, tail
        self.relabel = relabel or (lambda node, line: (node, line))
        self.buffer = ""

    def write(self, data: str) -> int:
        self.buffer += data
        if "\n" in self.buffer:
            *lines, self.buffer = self.buffer.split("\n")
            self._emit(lines)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buffer:
            self._emit([self.buffer])
            self.buffer = ""

    def _emit(self, lines: list[str]) -> None:
        lines = [line.rstrip("\r") for line in lines]
        self.tail.extend(lines)
        with self.lock:
            if self.log_file:
                self.log_file.write("".join(f"{line}\n" for line in lines))
                self.log_file.flush()
            if self.out:
                shown = (self.relabel(self.node, line) for line in lines)
                self.out.write("".join(f"[{node}] {line}\n" for node, line in shown))
                self.out.flush()
