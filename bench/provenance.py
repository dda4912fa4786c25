"""What a section's figures were measured on and from: the machine (CPU, cores, memory, OS, torch, Open MPI), the
load average, the date, and the commit of the checkout (``+changes`` when its tracked files, other than the bench's
own outputs, differ from it) as it was before the bench wrote anything (:func:`tree`). Stored with each section by
:func:`bench.report.save_section`; rendered under each section of the page, with :func:`load_flag`."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.nodes import REPO


def _first(pattern: str, text: str, default: str = "?") -> str:
    match = re.search(pattern, text, re.MULTILINE)
    return match[1].strip() if match else default


def machine() -> dict:
    """What the numbers were measured on."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    try:
        ompi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        ompi = ""
    import torch

    mem_kib = int(_first(r"^MemTotal:\s+(\d+)", read("/proc/meminfo"), "0"))
    return {
        "cpu": _first(r"^model name\s*:\s*(.*)$", read("/proc/cpuinfo")),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "os": _first(r'^PRETTY_NAME="?([^"\n]*)', read("/etc/os-release")),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "open_mpi": _first(r"\(Open MPI\)\s*(\S+)", ompi),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_avg_1m": round(os.getloadavg()[0], 1),  # other work on the machine makes every number noisier
        "commit": tree(),
    }


# What the bench writes itself (the page, its JSON and plots, the drills page under docs/; the README's table): not the
# code measured, so a change there is no '+changes'. `make bench` is two processes (the sections, then the drills):
# the second's first look at the tree comes after the first has written these.
OUTPUTS = (":(exclude)docs", ":(exclude)README.md")


def _commit() -> str:
    """The checkout's commit, '+changes' when the tracked files other than the bench's own outputs (:data:`OUTPUTS`)
    differ from it ('?' outside git)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    head = git("rev-parse", "--short", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *OUTPUTS)
    return (head + (" +changes" if changed else "")) if head else "?"


@functools.cache
def tree() -> str:
    """:func:`_commit` as it was at this process's first call. The bench's entry points call it before any section
    writes (``python -m bench`` first thing, ``python -m bench.<section>`` through :func:`began`), so the files the
    bench writes itself (docs/benchmarks.json and .md, the plots, the README's table) do not mark the sections
    after the first as run on a changed tree."""
    return _commit()


# How long a section waits for the machine to settle before it starts (:func:`began`). The 1-minute load average
# decays by e every minute once the work is gone: after the control plane's 64 nodes (64.9) it is under the 2 cores
# in about 3.5 minutes; a machine still busy after 6 is busy with other work, and the section is flagged.
SETTLE_MOST = 360.0
SETTLE_POLL = 5.0


def began(settle: bool = False) -> dict:
    """When a section starts and the load it finds (stored with its machine by :func:`save_section`). ``settle``
    (every full run, never a quick one): first wait, up to :data:`SETTLE_MOST` seconds, for the 1-minute load
    average to come down to the machine's cores -- the previous section's own work still in it would otherwise flag
    the next section (:func:`load_flag`), as it flagged four of the first six of a run on 2026-11-29; the wait is
    stored."""
    tree()
    waited = _settle() if settle else None
    return {"started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 1),
            **({"settle_waited_s": round(waited)} if waited is not None else {})}


def _settle() -> float:
    """Wait for the 1-minute load average to come down to the cores (at most SETTLE_MOST s); the seconds waited."""
    start, cores = time.monotonic(), os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > cores:
        print(f"waiting for the load average ({load:.1f}) to come down to {cores} (at most {SETTLE_MOST:.0f} s)",
              flush=True)
    while load > cores and time.monotonic() - start < SETTLE_MOST:
        time.sleep(SETTLE_POLL)
        load = os.getloadavg()[0]
    return time.monotonic() - start


def settled(machine: dict) -> str:
    """The page's words for how long the section waited for the load to settle (:func:`began`), or ''."""
    waited = machine.get("settle_waited_s")
    return f" (after {waited} s waiting for the load to settle)" if waited else ""


def load_flag(machine: dict) -> str:
    """Why a section's figures are suspect, or '': it started at a 1-minute load average above the machine's
    cores, so the machine was still busy: with other work, or with the bench's own previous section, which a
    1-minute average still holds (docs/benchmarking.md)."""
    start = machine.get("load_avg_1m_at_start")
    if start is None or start <= machine["cores"]:
        return ""
    return (f"started at load average {start:g}, above the machine's {machine['cores']} cores: the machine was still "
            "busy (other work, or the previous section)")
