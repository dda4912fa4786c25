"""Straggler drills: one rank computes slower than the others by a known factor, and the orchestrator's slow-rank
line (:mod:`multinode.diagnose.slowranks`) must name it within a bounded number of its windows -- or, below the
threshold, never. Run by ``python -m bench.drills`` (the page's stragglers table) and asserted by
tests/integration/test_slow_rank_local.py.

How a rank is made slower, whatever else the machine runs: every rank's job processes get a CPU quota of
:data:`FAIR_SHARE` of a core (a cgroup per node: :mod:`multinode.providers.local.cpuquota`), node-2's
``FAIR_SHARE / slowdown``. The quota's period is :data:`PERIOD_US`, a tenth of the kernel's default: a step then
spans several periods; at 100 ms a step's few milliseconds often fit in one period's quota, and the median step --
the compute the comparison reads -- hid the throttle (at 10 % of a core a rank was never named). A quota is not a
compute ratio: the steps also wait for each other, and the kernel hands quota out in slices, so the compute a quota
gives is measured, not assumed (:attr:`StragglerResult.achieved`). Measured here, 2026-11-27, at load 5-9: half the
fair share gave node-2 2.05-3.0 times the others' compute per step; 1/1.1 of it, 1.11-1.29 times (once 1.7 at
1/1.2 under the whole suite's load: why the drill below the threshold uses 1.1).

Without a slowdown nothing is throttled: the unthrottled spread, each rank's compute in each window against the
median of the others' in the same window, is what the threshold (1.5) is chosen against.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.drills.common import RUN_BOUND, watched

FAIR_SHARE = 0.2  # of a core, every rank while a slowdown is applied
PERIOD_US = 10_000  # 10 ms
EPOCHS = 60  # digits (20 steps an epoch here): room for WATCH_WINDOWS windows of 2 s under the quota, then full speed
WATCH_WINDOWS = 8  # rank 2's windows under the quota before a run that names nobody lets it go
ENTRY = re.compile(r"^\[node-0\] \[rank0\]: .*epoch 2/")  # the ranks are past their start: the quota starts here
STRAGGLER_DRILLS = {"stragglers: none throttled": None, "stragglers: node-2 at half the fair share": 2.0,
                    "stragglers: node-2 at 1/1.1 of the fair share": 1.1}


@dataclass
class StragglerResult:
    slowdown: float | None  # node-2's compute against the others' (None: nothing throttled)
    exit_code: int
    windows: dict[int, list[float]]  # rank -> its compute medians (ms), window by window, from the nodes' logs
    before: int  # rank 2's windows printed before the quota began
    during: int  # ... and when it ended
    named: list[dict] | None  # the summary's slow_ranks
    named_lines: list[str] = field(default_factory=list)  # the console's "slow rank:" lines
    left: dict = field(default_factory=dict)

    @property
    def ratios(self) -> list[float]:
        """Every window of every rank against the median of the other ranks' same window: the spread."""
        count = min(map(len, self.windows.values()), default=0)
        return [own[i] / statistics.median(w[i] for r, w in self.windows.items() if r != rank)
                for rank, own in self.windows.items() for i in range(count)]

    @property
    def achieved(self) -> float | None:
        """Rank 2's compute against the others' median, median over its windows under the quota: the slowdown the
        quota gave (a quota is not the step's compute: the steps also wait, and the kernel hands quota out in
        slices)."""
        count = min(map(len, self.windows.values()), default=0)
        under = [self.windows[2][i] / statistics.median(w[i] for r, w in self.windows.items() if r != 2)
                 for i in range(self.before, min(count, self.during))] if 2 in self.windows else []
        return round(statistics.median(under), 3) if under else None

    def streak(self, windows: int) -> float | None:
        """The highest ratio a rank held for ``windows`` windows in a row (the lowest of those windows): what
        naming it takes (multinode.diagnose.slowranks), where one window's ratio alone does not."""
        count = min(map(len, self.windows.values()), default=0)
        by_rank = {rank: [own[i] / statistics.median(w[i] for r, w in self.windows.items() if r != rank)
                          for i in range(count)] for rank, own in self.windows.items()}
        runs = [min(ratios[i:i + windows]) for ratios in by_rank.values() for i in range(len(ratios) - windows + 1)]
        return max(runs) if runs else None

    @property
    def windows_to_name(self) -> int | None:
        """Rank 2's windows from the first under the quota to the one that named it (its compute in the record)."""
        if not self.named:
            return None
        mine = self.windows.get(2, [])
        at = next((i for i, ms in enumerate(mine) if i >= self.before
                   and abs(ms - self.named[0]["compute_ms"]) < 0.01), None)
        return None if at is None else at - self.before + 1


def _windows(log_dir: Path) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for log in sorted(log_dir.glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "STEPTIMES {" in line:
                row = json.loads(line.split("STEPTIMES ", 1)[1])
                found.setdefault(row["rank"], []).append(row["compute_ms"])
    return found


def run_straggler_drill(cluster, slowdown: float | None, epochs: int = EPOCHS) -> StragglerResult:
    """Our trainer on 3 nodes; from epoch 2 on, every rank at :data:`FAIR_SHARE` of a core and node-2 at
    ``FAIR_SHARE / slowdown`` until node-2's rank is named (or has printed :data:`WATCH_WINDOWS` windows under the
    quota), then full speed to the end. ``cluster``: tests' Cluster (``popen``, ``state``, ``runs``, ...)."""
    from multinode.providers.local.cpuquota import throttled

    proc = cluster.popen("train", "--nodes", "3", f"--args=--workload digits {epochs} {epochs}")
    before = during = 0
    with watched(proc) as (out, err):
        out.wait_for(ENTRY.pattern, timeout=RUN_BOUND)
        # This run's directory by the id it printed: the newest by name is another drill's where run ids were named
        # (bench.drills' one cluster: every straggler row read the preemption drill's windows, 2026-11-29).
        log_dir = cluster.state.run_dir(re.search(r"^run (\S+): MODE=", "".join(out.lines), re.M)[1])
        if slowdown is not None:
            with contextlib.ExitStack() as quota:
                before = len(_windows(log_dir).get(2, []))
                for node, share in (("node-0", FAIR_SHARE), ("node-1", FAIR_SHARE), ("node-2", FAIR_SHARE / slowdown)):
                    assert quota.enter_context(throttled(cluster.state, node, share, period_us=PERIOD_US)), node
                _until_named_or(out, lambda: len(_windows(log_dir).get(2, [])) >= before + WATCH_WINDOWS)
                during = len(_windows(log_dir).get(2, []))
        proc.wait(timeout=RUN_BOUND)
    summary = json.loads((log_dir / "summary.json").read_text())
    return StragglerResult(slowdown, proc.returncode, _windows(Path(summary["log_dir"])), before, during,
                           summary["slow_ranks"], [line for line in out.lines if "slow rank:" in line],
                           cluster.job_processes())


def _until_named_or(out, enough) -> None:
    """Until the console names a slow rank, or ``enough()`` (rank 2 printed its windows), or the run ended; a hang
    guard of RUN_BOUND (each of the three is an event)."""
    import time

    end = time.monotonic() + RUN_BOUND
    while time.monotonic() < end:
        if any("slow rank:" in line for line in list(out.lines)) or enough() or not out.thread.is_alive():
            return
        time.sleep(0.5)
    raise TimeoutError(f"no slow rank named and too few windows within {RUN_BOUND} s:\n{out.tail()}")


def spread(results: list[StragglerResult]) -> dict:
    """The unthrottled runs' ratios: how far one rank's window strays from the others' with nothing throttled, and
    the highest it held for WINDOWS windows in a row (what naming a rank takes)."""
    from multinode.diagnose.slowranks import WINDOWS

    quiet = [res for res in results if res.slowdown is None]
    ratios = sorted(r for res in quiet for r in res.ratios)
    if not ratios:
        return {}
    streaks = [s for res in quiet if (s := res.streak(WINDOWS)) is not None]
    return {"windows": len(ratios), "median": round(statistics.median(ratios), 3),
            "p95": round(ratios[min(len(ratios) - 1, int(0.95 * len(ratios)))], 3), "max": round(ratios[-1], 3),
            "in_a_row": round(max(streaks), 3) if streaks else None}
