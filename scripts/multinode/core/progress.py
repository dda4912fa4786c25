"""A long wait, shown while it lasts (Terraform's apply and destroy, the nodes' bootstrap).

On a terminal, one line rewritten in place (a carriage return, the text cut to the terminal's width so it never
wraps) with the seconds so far; anywhere else -- a pipe, a log file, CI -- a plain line each time what it says
changes, and never a carriage return. :meth:`Progress.done` ends it with a last line (on a terminal, the updating
line becomes it). The text comes from the caller: this module only decides how to show it.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO


def is_terminal(out: TextIO) -> bool:
    """Whether ``out`` is a terminal (a stream without ``isatty`` is not)."""
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """``label: text (12s)`` rewritten in place on a terminal; ``label: text`` once per change otherwise."""

    def __init__(self, label: str, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 terminal: bool | None = None) -> None:
        self.label, self.out, self.clock = label, out or sys.stderr, clock
        self.terminal = is_terminal(self.out) if terminal is None else terminal
        self.started = clock()
        self._said: str | None = None
        self._shown = 0  # characters of the line now on the terminal

    def update(self, text: str) -> None:
        """Say ``text`` (the same text again adds no line off a terminal; on one it refreshes the seconds)."""
        if self.terminal:
            self._rewrite(f"{self.label}: {text} ({self.clock() - self.started:.0f}s)")
        elif text != self._said:
            print(f"{self.label}: {text}", file=self.out, flush=True)
        self._said = text

    def note(self, text: str) -> None:
        """A line that stays (``text`` as given), the updating line drawn again at the next update."""
        if self.terminal:
            self._rewrite(text)
            self.out.write("\n")
            self.out.flush()
            self._shown = 0
        else:
            print(text, file=self.out, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        """An updating line left on a terminal (the wait failed) ends its line, so what follows starts on its own."""
        if self.terminal and self._shown:
            self.out.write("\n")
            self.out.flush()
            self._shown = 0

    def done(self, text: str) -> None:
        """The last line: ``label: text (12s)``, on a line of its own."""
        line = f"{self.label}: {text} ({self.clock() - self.started:.0f}s)"
        if self.terminal:
            self._rewrite(line)
            self.out.write("\n")
            self.out.flush()
            self._shown = 0
        else:
            print(line, file=self.out, flush=True)

    def _rewrite(self, line: str) -> None:
        width = shutil.get_terminal_size().columns - 1
        line = line if len(line) <= width else line[:max(width - 3, 0)] + "..."
        self.out.write("\r" + line + " " * max(self._shown - len(line), 0))
        self.out.flush()
        self._shown = len(line)


def relay(label: str, lines, out: TextIO, log: TextIO | None = None) -> int:
    """A command's output (``lines``) shown as one long wait: on a terminal, one updating line with its latest line
    (every line kept in ``log``); anywhere else every line passed through as it came. The count of lines."""
    terminal = is_terminal(out)
    progress = Progress(label, out) if terminal else None
    count = 0
    for count, line in enumerate(lines, 1):
        if log is not None:
            log.write(line)
        if progress is None:
            out.write(line)
            out.flush()
        elif line.strip():
            progress.update(line.strip())
    if progress is not None:
        progress.done(f"{count} lines" + (f"; every line in {log.name}" if log is not None else ""))
    return count


if __name__ == "__main__":  # ``<command> 2>&1 | python -m multinode.core.progress LABEL [LOG]`` (make image)
    with open(sys.argv[2], "w", encoding="utf-8") if len(sys.argv) > 2 else contextlib.nullcontext() as kept:
        relay(sys.argv[1], sys.stdin, sys.stdout, kept)
