"""Whole lines from a node's byte stream: what a job's output becomes on the console and in the per-node logs.

Concurrent writers on one pipe interleave mid-line; :class:`LineSink` re-assembles each node's stdout and stderr
into whole lines, relabels them (e.g. by mpirun's rank tags), writes them to the node's log file and, prefixed
``[node-i]``, to the console under one lock -- but for the lines an ``observe`` hook reads (the run's own: the
trainer's step times), which go to the log only.

One stream can also carry several writers whose every chunk starts with a tag (mpirun ``--tag-output``): a
chunk that ends mid-line is continued by the writer's next chunk, after other writers' lines. A relabel may
then be a :class:`TaggedLines`, which keeps each writer's unfinished line until its newline arrives and
returns zero or more whole lines per line of the stream.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO, Union

Relabel = Callable[[str, str], Union[tuple[str, str], list[tuple[str, str]]]]
"""(node the line arrived from, line) -> (node it belongs to, line to show), or a list of such whole lines
(none while a writer's line is unfinished); e.g. mpirun's rank tags."""


class TaggedLines:
    """Relabel for a stream of tagged chunks: ``tag`` matches a writer's tag (its groups name the writer),
    ``label(match, text)`` gives a whole line of that writer as (node, line), or None to keep it as it came.

    Within one line of the stream, a newline belongs to the last tagged piece; every piece before it is the
    unfinished line of its writer, kept until that writer's newline. Text before the first tag is the
    stream's own (mpirun's messages). :meth:`close` returns what writers left unfinished."""

    def __init__(self, tag: re.Pattern, label: Callable[[re.Match, str], tuple[str, str] | None]):
        self.tag, self.label = tag, label
        self.pending: dict[tuple, tuple[re.Match, str]] = {}
        self.lock = threading.Lock()  # one instance serves a node's stdout and stderr sinks

    def __call__(self, node: str, line: str) -> list[tuple[str, str]]:
        matches = list(self.tag.finditer(line))
        if not matches:
            return [(node, line)]
        out = [(node, line[:matches[0].start()])] if matches[0].start() else []
        with self.lock:
            for i, match in enumerate(matches):
                end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
                earlier = self.pending.pop(match.groups(), (match, ""))[1]
                text = earlier + line[match.end():end]
                if i + 1 < len(matches):
                    self.pending[match.groups()] = (match, text)
                else:
                    out.append(self.label(match, text) or (node, match[0] + text))
        return out

    def close(self, node: str) -> list[tuple[str, str]]:
        with self.lock:
            left, self.pending = self.pending, {}
        return [self.label(match, text) or (node, match[0] + text) for match, text in left.values()]


class LineSink:
    """File-like target of one node's stdout or stderr: emits whole lines only."""

    def __init__(self, node: str, lock: threading.Lock, log_file: TextIO | None, out: TextIO | None, tail: deque,
                 relabel: Relabel | None = None, observe: Callable[[str, str], bool] | None = None):
        self.node, self.lock, self.log_file, self.out, self.tail = node, lock, log_file, out, tail
        self.relabel = relabel or (lambda node, line: (node, line))
        self.observe = observe  # (node, line) -> True: read by the run, kept off the console and the tail
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
        if isinstance(self.relabel, TaggedLines):
            self._write(self.relabel.close(self.node))

    def _emit(self, lines: list[str]) -> None:
        shown: list[tuple[str, str]] = []
        for line in lines:
            got = self.relabel(self.node, line.rstrip("\r"))
            shown.extend(got if isinstance(got, list) else [got])
        self._write(shown)

    def _write(self, shown: list[tuple[str, str]]) -> None:
        """The log and the tail hold each line as relabeled (``[rankN]: ...`` under mpirun); the console adds
        the node it belongs to."""
        if not shown:
            return
        read = [self.observe is not None and self.observe(node, line) for node, line in shown]
        kept = [pair for pair, taken in zip(shown, read) if not taken]
        self.tail.extend(line for _, line in kept)
        with self.lock:
            if self.log_file:
                self.log_file.write("".join(f"{line}\n" for _, line in shown))
                self.log_file.flush()
            if self.out and kept:
                self.out.write("".join(f"[{node}] {line}\n" for node, line in kept))
                self.out.flush()
