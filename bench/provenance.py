"""What a section's figures were measured on and from: the machine (CPU, cores, memory, OS, torch, Open MPI), the
load average, the date, and the commit of the checkout (``+changes`` when its tracked files differ from it).
Stored with each section by :func:`bench.report.save_section`; rendered under each section of the page."""

from __future__ import annotations

import os
import platform
import re
import subprocess
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
        "commit": _commit(),
    }


def _commit() -> str:
    """The checkout's commit, '+changes' when the work tree differs from it ('?' outside git)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""

    head = git("rev-parse", "--short", "HEAD")
    return (head + (" +changes" if git("status", "--porcelain", "--untracked-files=no") else "")) if head else "?"


def began() -> dict:
    """When a section starts and the load it finds (stored with its machine by :func:`save_section`)."""
    return {"started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 1)}
