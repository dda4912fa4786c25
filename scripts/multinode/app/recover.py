"""``RECOVER=N``: a run that ends preempted or with a lost node goes on by itself, at most N times.

    run -> (preempted | a node lost) -> replace that node only -> run again from the freshest snapshot
                                      \\-> refused or slow (RECOVER_WAIT) -> go on without it

:class:`Recovery` wraps :class:`multinode.app.run.Run`: every attempt is a whole run of the same run id (the
nodes' snapshots live under it), so pre-flight, sync and setup are the run's own -- incremental, so on the
nodes that kept their state they cost a check, and only the new node receives the code. Between attempts:

1. **what was lost**: a preempted run names the node that got the notice (rank 0's report, by host name);
   a failed run is probed over SSH and the nodes that no longer answer are lost (a failure with every node
   answering is the job's own and is raised as it is: recovery does not retry bugs);
2. **replace it** (the provider's ``replace``: a new namespace, or one new instance; the other nodes untouched),
   waiting at most ``RECOVER_WAIT`` seconds; a refusal (``CapacityRefused``) or a slow one leaves the run to
   **go on with the nodes it has** -- our trainer keeps the global batch by accumulation and re-shards the rest
   of the epoch (``training/sampler.py``), so the result does not depend on how many nodes finished it;
3. **resume**: the next attempt (a new head if node-0 was the lost one) starts from the freshest complete
   snapshot on any surviving node.

The :class:`~multinode.app.timeline.Timeline` (notice or loss -> checkpoint -> replacement asked -> node ready -> job started again,
each with its time, and the steps lost) is saved as ``recovery.json`` beside the summary and added to the
final summary. Each attempt's logs and summary are kept under ``attempt-<k>/`` of the run directory.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TextIO

from multinode.app.growback import GrowBack, job_trains, stop_with_grace
from multinode.app.run import Run
from multinode.app.timeline import Timeline, checkpoint_time
from multinode.checks.preflight import probe_ssh
from multinode.core.config import LaunchSpec
from multinode.core.errors import CapacityRefused, JobFailed, MultinodeError, Preempted
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.core.state import ClusterState
from multinode.diagnose.summary import RunSummary
from multinode.providers import get_provider
from multinode.ssh.runner import RemoteRunner

DEFAULT_GRACE = 30.0  # seconds a rank gets for its checkpoint when recovery signals it and GRACE was not given
# A node is lost when it answers neither SSH probe: the first short, the second for a node merely busy (with the
# host's load average near 14 on 2 cores, node-0 and node-1 missed a 5 s probe right after a coordinated
# checkpoint and were replaced, their snapshots wiped: tests/integration/test_growback_local.py, 2026-11-24).
PROBE_SECONDS = (5.0, 20.0)


@dataclass(frozen=True)
class Loss:
    """Why an attempt ended: the nodes to replace, and what the run knew about its last step."""

    nodes: list[str]
    cause: str  # "notice" | "lost"
    last_step: int | None  # the step every rank stopped at (notice), or the highest heartbeat (lost)
    error: MultinodeError


class Recovery:
    """The run, and up to ``spec.recover`` recoveries of it (see the module doc)."""

    def __init__(self, state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO | None = None,
                 provider=None) -> None:
        self.state, self.out = state, out or sys.stdout
        # Ranks must be able to take a notice (SIGTERM) for a coordinated checkpoint: GRACE is on for recovery.
        self.spec = spec if spec.grace is not None else replace(spec, grace=DEFAULT_GRACE)
        self.cluster = inventory  # the whole cluster, as the provider last wrote it
        self.provider = provider or get_provider(inventory.provider)
        self.timeline = Timeline()
        self.attempt = 0  # recoveries so far
        self.grown = 0  # times the run grew back to the whole cluster

    def say(self, message: str) -> None:
        print(f"[recover] {message}", file=self.out, flush=True)

    def execute(self) -> RunSummary | None:
        active, spec, pending = self.cluster.first(self.spec.nodes), self.spec, None
        while True:
            run = Run(self.state, active, spec, self.out)
            with self._grow_back(active, spec) as grow:
                try:
                    summary = run.execute()
                except (Preempted, JobFailed) as err:
                    ended = err
                else:
                    ended = None
            if pending is not None:
                self._resumed(pending, run)
            if ended is None:
                return self._finish(run, summary)
            if grow.notified:  # our own notice ended the job: every node is back
                self.grown += 1
                self._grow_stop(run, ended)
                self._keep_attempt(run.run_dir, f"grow-{self.grown}")
                active, pending = self.cluster.first(self.spec.nodes), Loss([], "grow", None, ended)
                spec = replace(spec, nodes=len(active.nodes))
                continue
            loss = self._what_was_lost(run, active, ended)
            if self.attempt >= self.spec.recover:
                self._save()
                raise ended
            self.attempt += 1
            self.say(f"recovery {self.attempt}/{self.spec.recover} of run {spec.run_id}")
            self._keep_attempt(run.run_dir, f"attempt-{self.attempt - 1}")
            active = self._replace_or_shrink(active, loss)
            spec, pending = replace(spec, nodes=len(active.nodes)), loss

    def _grow_back(self, active: Inventory, spec: LaunchSpec) -> GrowBack:
        """While the run goes on with fewer nodes: ask for the missing ones again every RECOVER_WAIT seconds."""
        here = {n.name for n in active.nodes}
        missing = [n.name for n in self.cluster.first(self.spec.nodes).nodes if n.name not in here]
        since = time.time()
        return GrowBack(missing, self._replace_now, lambda: self._notice(active, spec, since),
                        self.spec.recover_wait, self.say)

    def _grow_stop(self, run: Run, ended: MultinodeError) -> None:
        """How the job took the notice for growing back: its coordinated checkpoint; or, when the notice met it
        where it takes none (past its last step, at exit), a failure -- the whole cluster then goes on from the
        freshest snapshot (a finished job's is its last). A bug of the job's own fails that attempt again."""
        if isinstance(ended, Preempted):
            self._checkpoint_written(run.summary.preempted if run.summary else None)
            return
        self.say("the notice ended the job without its checkpoint (it was finishing): the whole cluster goes on "
                 "from the freshest snapshot")
        self.timeline.add("no checkpoint", "the job failed as the notice came: going on from the freshest snapshot")

    def _replace_now(self, name: str) -> Inventory:
        self.cluster = self.provider.replace(self.state, self.cluster, name)
        self.timeline.add("node back", name)
        return self.cluster

    def _notice(self, active: Inventory, spec: LaunchSpec, since: float) -> bool:
        """The GRACE notice to the ranks once the job trains (:func:`~multinode.app.growback.job_trains`; ``since``:
        this attempt's start); True when it reached the job."""
        if not job_trains(active, spec, since):
            return False
        at = time.time()
        if not stop_with_grace(active, spec):
            return False
        self.timeline.add("notice", f"growing back: SIGTERM with GRACE to the ranks on {len(active.nodes)} node(s)",
                          at=at)
        return True

    # --- between attempts ----------------------------------------------------------------

    def _what_was_lost(self, run: Run, active: Inventory, err: MultinodeError) -> Loss:
        """The node(s) to replace: the one a notice named, and every node that no longer answers SSH. A failure
        with every node answering is the job's own: raised as it is (recovery does not retry bugs)."""
        lost = self._silent(active)
        silent = list(lost)
        if isinstance(err, Preempted):
            report = (run.summary.preempted if run.summary else None) or {}
            if report.get("stopped_by"):  # Ctrl-C (or a scheduler) stopped the orchestrator: nothing to recover
                raise err
            host = report.get("noticed_on")
            named = [n.name for n in active.nodes if host in (n.hostname, n.name)]
            at = report.get("noticed_at")
            self.timeline.add("notice", f"{report.get('notice', 'a notice')} on {', '.join(named) or host or '?'}",
                              at=float(at) if isinstance(at, (int, float)) else None)
            stop = self._checkpoint_written(report)
            also = [n for n in silent if n not in named]
            if also:
                self.timeline.add("node lost", f"{', '.join(also)} (no SSH: {lost[also[0]]})")
            return Loss(named + also, "notice", stop.get("step"), err)
        if not silent:
            raise err
        self.timeline.add("node lost", f"{', '.join(silent)} (no SSH: {lost[silent[0]]})")
        return Loss(silent, "lost", self._last_step(active.only([n.name for n in active.nodes if n.name not in silent])),
                    err)

    @staticmethod
    def _silent(active: Inventory) -> dict[str, str]:
        """{node: why} for the nodes that answer neither SSH probe (PROBE_SECONDS): a node busy enough to miss the
        first is not lost -- replacing it would wipe its snapshots."""
        nodes = active
        for timeout in PROBE_SECONDS:
            silent = {name: why for name, (ok, why) in probe_ssh(nodes, timeout=timeout).items() if not ok}
            if not silent:
                break
            nodes = active.only([n.name for n in active.nodes if n.name in silent])
        return silent

    def _checkpoint_written(self, report: dict | None) -> dict:
        """The coordinated checkpoint of a PREEMPTED report on the timeline, at the time it was written (now if the
        report does not say); its ``stopped_at``."""
        report = report or {}
        stop = report.get("stopped_at") or {}
        self.timeline.add("checkpoint written", f"step {stop.get('step')}, {report.get('checkpoint_seconds', '?')} s",
                          at=checkpoint_time(report))
        return stop

    def _last_step(self, alive: Inventory) -> int | None:
        """The highest optimizer step a surviving rank reached (our trainer's heartbeat files hold it)."""
        commands = {n.name: f"cat {node_run_dir(alive, n.name, self.spec.run_id)}/heartbeat-rank* 2>/dev/null; true"
                    for n in alive.nodes}
        with RemoteRunner(alive, connect_timeout=5.0) as runner:
            answers = runner.run_each(commands, timeout=10)
        steps = [int(tok) for res in answers.values() for tok in res.stdout.split() if tok.isdigit()]
        return max(steps) if steps else None

    def _replace_or_shrink(self, active: Inventory, loss: Loss) -> Inventory:
        """Each lost node replaced within RECOVER_WAIT, or the run goes on without it."""
        keep = [n.name for n in active.nodes]
        for name in loss.nodes:
            self.timeline.add("replacement asked", name)
            self.say(f"{name} {'got a notice' if loss.cause == 'notice' else 'is lost'}: asking "
                     f"{self.cluster.provider} for a replacement (waiting at most {self.spec.recover_wait:.0f} s)")
            new, why = self._replace(name)
            if new is not None:
                self.cluster = new
                self.timeline.add("node ready", name)
                self.say(f"{name} replaced (the other nodes untouched)")
                continue
            keep.remove(name)
            self.timeline.add("going on without it", f"{name}: {why}")
            self.say(f"{name}: {why}; going on with {len(keep)} node(s) at the same global batch")
        if not keep:
            raise loss.error
        return self.cluster.only(keep)

    def _replace(self, name: str) -> tuple[Inventory | None, str]:
        """(the new inventory, "") or (None, why not) within RECOVER_WAIT. A replacement still under way then
        goes on in the background; the node is there for the next run."""
        box: dict = {}
        cluster = self.cluster

        def ask() -> None:
            try:
                box["inventory"] = self.provider.replace(self.state, cluster, name)
            except CapacityRefused as err:
                box["refused"] = str(err)
            except MultinodeError as err:
                box["refused"] = f"the replacement failed: {err}"

        worker = threading.Thread(target=ask, name=f"mn-replace-{name}", daemon=True)
        worker.start()
        worker.join(self.spec.recover_wait)
        if worker.is_alive():
            return None, f"no replacement within RECOVER_WAIT={self.spec.recover_wait:.0f} s"
        if "refused" in box:
            return None, box["refused"]
        return box["inventory"], ""

    def _resumed(self, loss: Loss, run: Run) -> None:
        """The next attempt's start on the timeline; steps lost = the last step reached - the step resumed from."""
        if run.started_at is None:  # the attempt ended before its job started: nothing resumed
            return
        resumed = run.resumed or {}
        self.timeline.add("job started again", f"from step {resumed.get('step', '?')} on "
                          f"{resumed.get('world_size', '?')} rank(s)", at=run.started_at)
        if loss.last_step is not None and isinstance(resumed.get("step"), int):
            self.timeline.steps_lost.append(max(0, loss.last_step - resumed["step"]))

    @staticmethod
    def _keep_attempt(run_dir: Path, name: str) -> None:
        """This attempt's logs and summary moved to ``<name>/`` (the next attempt writes the same names)."""
        keep = run_dir / name
        keep.mkdir(parents=True, exist_ok=True)
        for path in list(run_dir.iterdir()):
            if not path.name.startswith(("attempt-", "grow-")):
                shutil.move(str(path), keep / path.name)

    # --- the end -------------------------------------------------------------------------

    def _save(self) -> dict:
        record = {"recoveries": self.attempt, **asdict(self.timeline)}
        run_dir = self.state.run_dir(self.spec.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "recovery.json").write_text(json.dumps(record, indent=2))
        return record

    def _finish(self, run: Run, summary: RunSummary | None) -> RunSummary | None:
        """The last attempt's summary with the timeline added (saved again), and the timeline printed."""
        if summary is None or not self.attempt:
            return summary
        summary = replace(summary, recovery=self._save())
        run.save(summary)
        for line in self.timeline.lines():
            print(line, file=self.out)
        return summary
