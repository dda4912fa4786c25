"""The model of a capture: what one look at the live ranks holds. Pure data, no I/O.

* :class:`Frame`: one Python frame (function, file, line, the line's source).
* :class:`Sample`: one look at one rank: its main thread's state (``None``: the process was gone), CPU
  ticks and stack (innermost first), or why there is no stack.
* :class:`RankDump`: every look at one rank of one node, with the raw capture it came from; ``last`` is
  the latest look at which the process was alive.

:mod:`multinode.diagnose.capture` builds these, :mod:`multinode.diagnose.rank` ranks them,
:mod:`multinode.diagnose.report` prints and saves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int
    code: str = ""

    def describe(self) -> str:
        where = f"{self.name} ({short_path(self.file)}:{self.line})"
        return f"{where}: {self.code}" if self.code else where


@dataclass(frozen=True)
class Sample:
    """One look at one rank. ``state`` None: the process was gone."""

    state: str | None
    cpu_ticks: int = 0  # the main thread's user + system time, in clock ticks
    frames: tuple[Frame, ...] = ()  # the main thread's stack, innermost first
    threads: int = 0
    error: str | None = None


@dataclass(frozen=True)
class RankDump:
    node: str
    pid: int
    run_id: str
    rank: int
    samples: tuple[Sample, ...]
    parent_is_rank: bool = False  # a child of a rank (DataLoader worker, ...) that inherited its RANK
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def last(self) -> Sample:
        alive = [s for s in self.samples if s.state is not None]
        return alive[-1] if alive else Sample(None)


def short_path(path: str) -> str:
    """torch/distributed/distributed_c10d.py rather than the whole site-packages path."""
    for marker in ("site-packages/", "dist-packages/", "/code/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


__all__ = ["Frame", "RankDump", "Sample", "short_path"]
