"""The CPU each test costs, for the suite's time budget (a pytest plugin, on only with
``MULTINODE_CPU_REPORT=<file.jsonl>``; ``python -m cpuaccount <file.jsonl>`` prints it by module).

The suite is bound by the machine's 2 cores, not by waits: three workers share them, so a test's wall time says
how long it waited for the CPU as much as what it costs. Each worker moves itself into a cgroup of its own
(cgroup v1 ``cpuacct``, ``cpuacct.usage``: docs.kernel.org/admin-guide/cgroup-v1/cpuacct.html; v2 ``cpu.stat``'s
``usage_usec``) before any test runs; every process it starts -- the nodes' sshd and the jobs they start, moto,
terraform -- is born in it, so the group's CPU time across a test is the test's, fixtures included (a module's
cluster is paid for by its first test). A node process moved to another group (the slow-rank drill's CPU quota)
is not counted after the move."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path("/sys/fs/cgroup")


def _group() -> tuple[Path, str] | None:
    """The worker's own group and the file its CPU time is read from, or None where no cgroup can be made."""
    name = f"multinode-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    v2 = (ROOT / "cgroup.controllers").exists()
    path = ROOT / name if v2 else ROOT / "cpuacct" / name
    try:
        path.mkdir(exist_ok=True)
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        return None
    return path, "cpu.stat" if v2 else "cpuacct.usage"


def _seconds(group: tuple[Path, str]) -> float:
    path, name = group
    text = (path / name).read_text()
    if name == "cpu.stat":
        return int(text.split("usage_usec")[1].split()[0]) / 1e6
    return int(text) / 1e9


class CpuAccount:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.group = _group()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.group is None:
            yield
            return
        cpu, wall, began = _seconds(self.group), time.monotonic(), time.time()
        yield
        record = {"test": item.nodeid, "cpu_s": round(_seconds(self.group) - cpu, 2),
                  "wall_s": round(time.monotonic() - wall, 2), "began": round(began, 1),
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
        with self.out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def pytest_configure(config) -> None:
    """Registered where tests run: in each xdist worker, or in pytest's own process when it runs them itself."""
    out = os.environ.get("MULTINODE_CPU_REPORT")
    worker = "PYTEST_XDIST_WORKER" in os.environ
    if out and (worker or not getattr(config.option, "numprocesses", None)):
        config.pluginmanager.register(CpuAccount(Path(out)), "cpuaccount")


def main(path: str) -> None:
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        entry = modules[record["test"].split("::")[0]]
        entry[0] += record["cpu_s"]
        entry[1] += record["wall_s"]
        entry[2] += 1
    total = sum(entry[0] for entry in modules.values())
    print(f"{'cpu s':>8} {'wall s':>8} {'tests':>5}  module   (cpu in all: {total:.0f} s)")
    for module, (cpu, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.1f} {wall:8.1f} {count:5d}  {module}")


if __name__ == "__main__":
    main(sys.argv[1])
