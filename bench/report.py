"""Results and the page: ``docs/benchmarks.json`` (every section's raw numbers, plus the machine and
date of the run) and ``docs/benchmarks.md`` (rendered from that JSON only, so the page always
shows what the JSON holds). Each section module has ``run(cluster, quick)``, ``section(result)``
and ``plot(result, out_dir)``; running one module alone updates its own key and re-renders the page.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from bench.nodes import REPO

DOCS = REPO / "docs"
ORDER = ("collectives", "launch", "throughput", "mpi_vs_ddp")


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned."""
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells for {len(headers)} headers")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def figure(path: Path, **subplots):
    """(fig, axes) of a headless matplotlib figure, laid out and saved to ``path`` as a PNG on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


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
    }


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save_section(path: Path, name: str, result: dict, quick: bool) -> dict:
    """Store one section's result (with the machine and date of this run) in the results file."""
    data = load(path)
    data[name] = {"quick": quick, "machine": machine(), "result": result}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def _section_text(name: str, result: dict) -> str:
    import importlib

    return importlib.import_module(f"bench.{name}").section(result)


def page(data: dict) -> str:
    """The whole docs/benchmarks.md from the results file's content."""
    lines = ["# Benchmarks", "",
             "Every figure is a ratio or a side-by-side pair measured in the same run, on the machine named "
             "under each section. Regenerate with `make bench` (all sections, its own local cluster; "
             "`QUICK=1` for the short mode CI runs, whose numbers mean nothing).", ""]
    for name in ORDER:
        if name not in data:
            continue
        entry = data[name]
        m = entry["machine"]
        text = _section_text(name, entry["result"]).rstrip("\n").split("\n")
        note = (f"*Measured {m['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, "
                f"kernel {m['kernel']}), torch {m['torch']}, Open MPI {m['open_mpi']}, CPU only"
                + (f", load average {m['load_avg_1m']} when the section ended" if "load_avg_1m" in m else "")
                + (", QUICK mode: not a measurement.*" if entry["quick"] else ".*"))
        lines += [text[0], "", note, *text[1:], ""]
    return "\n".join(lines)


def write_page(results: Path, md: Path) -> None:
    md.write_text(page(load(results)))


def standalone(name: str, nodes: int, run, plot) -> None:
    """``python -m bench.<name>``: own cluster up, run, down; update the results, plots and page."""
    parser = argparse.ArgumentParser(description=f"benchmark section {name!r}")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the benchmark works")
    parser.add_argument("--out-dir", type=Path, default=DOCS, help="where benchmarks.json/.md and the plots go")
    args = parser.parse_args()
    from bench.nodes import bring_up

    cluster = bring_up(nodes, "bench")
    try:
        result = run(cluster, quick=args.quick)
    finally:
        cluster.down()
    publish(name, result, args.quick, args.out_dir, plot)


def publish(name: str, result: dict, quick: bool, out_dir: Path, plot=None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "benchmarks.json"
    save_section(results, name, result, quick)
    if plot is not None:
        for path in plot(result, out_dir):
            print(f"wrote {path}")
    write_page(results, out_dir / "benchmarks.md")
    print(f"wrote {results} and {out_dir / 'benchmarks.md'}")
