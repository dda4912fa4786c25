"""``RECOVER=N``: what a run does between its attempts when one ends preempted or with a lost node, at most N times.

    attempt -> (preempted | a node lost) -> replace that node only -> next attempt from the freshest snapshot
                                          \\-> refused or slow (RECOVER_WAIT) -> go on without it
    attempt on fewer nodes -> (grow-back's notice, every node back) -> next attempt on the whole cluster

The attempts are the run's (:class:`multinode.app.run.Run` loops over them, holding its claim and its connections);
every attempt is of the same run id (the nodes' snapshots live under it), so pre-flight, sync and setup are the
run's own -- incremental, so on the nodes that kept their state they cost a check, and only the new node receives
the code. :meth:`Recovery.after` reads how an attempt ended (its :class:`~multinode.core.outcome.Outcome` and
summary) and answers with the next attempt's nodes, or None for the end of the run:

1. **what was lost**: a preempted attempt names the node that got the notice (rank 0's report, by host name); a
   failed, stalled or lost one is probed over SSH and the nodes that no longer answer are lost (a failure with
   every node answering is the job's own: recovery does not retry bugs); a job the orchestrator's own stop signal
   ended is not recovered;
2. **replace it** (the provider's ``replace``: a new namespace, or one new instance; the other nodes untouched),
   waiting at most ``RECOVER_WAIT`` seconds, or not at all when it takes longer than a restart of the job
   (:mod:`multinode.app.replacements`: wait or shrink); a refusal or a slow one leaves the run to
   **go on with the nodes it has** -- our trainer keeps the global batch by accumulation and re-shards the rest
   of the epoch (``training/sampler.py``), so the result does not depend on how many nodes finished it;
3. **resume**: the next attempt (a new head if node-0 was the lost one) starts from the freshest complete
   snapshot on any surviving node. While it runs on fewer nodes, :meth:`Recovery.grow_back` asks for the missing
   ones again (:mod:`multinode.app.growback`) and, once they are back, gives the job the backend's notice.

The :class:`~multinode.app.timeline.Timeline` (notice or loss -> checkpoint -> replacement asked -> node ready -> job
started again, each with its time, and the steps lost) goes into the run's summary and ``recovery.json``. Each
attempt's logs and summary are kept under ``attempt-<k>/`` (``grow-<k>/``) of the run directory.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from multinode.app import notices
from multinode.app.growback import GrowBack, job_trains
from multinode.app.replacements import Replacements, wait_seconds
from multinode.app.timeline import Timeline, checkpoint_time
from multinode.backends.base import Backend, RunContext
from multinode.checks.preflight import probe_ssh
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.core.outcome import Outcome
from multinode.core.state import ClusterState
from multinode.diagnose.summary import RunSummary
from multinode.providers import get_provider

DEFAULT_GRACE = 30.0  # seconds a rank gets for its checkpoint when recovery signals it and GRACE was not given
# A node is lost when it answers neither SSH probe: the first short, the second for a node merely busy (with the
# host's load average near 14 on 2 cores, node-0 and node-1 missed a 5 s probe right after a coordinated
# checkpoint and were replaced, their snapshots wiped: tests/integration/test_growback_local.py, 2026-11-24).
PROBE_SECONDS = (5.0, 20.0)


@dataclass(frozen=True)
class Loss:
    """Why an attempt ended: the nodes to replace, and what the run knew about its last step."""

    nodes: list[str]
    cause: str  # "notice" | "lost" | "grow"
    last_step: int | None  # the step every rank stopped at (notice), or the highest heartbeat (lost)


class Recovery:
    """The steps between a run's attempts (see the module doc)."""

    def __init__(self, state: ClusterState, cluster: Inventory, spec: LaunchSpec, say: Callable[[str], None],
                 provider=None) -> None:
        self.state, self.spec, self.say = state, spec, say
        self.cluster = cluster  # the whole cluster, as the provider last wrote it
        self.provider = provider or get_provider(cluster.provider)
        self.timeline = Timeline()
        self.attempt = 0  # recoveries so far
        self.grown = 0  # times the run grew back to the whole cluster
        self.pending: Loss | None = None  # what the attempt under way recovers from
        self.growing = GrowBack.idle()  # the attempt under way's grow-back
        self.label = ""  # where the ended attempt's files are kept
        self.started = time.time()  # the run's start: a notice older than it is not this run's
        self.estimate = self.provider.replacement_estimate(state, cluster)  # a bad MULTINODE_REPLACE_DELAY: one line
        self.restart_seconds: float | None = None  # measured: the run's start to its first job's launch
        self.replacements = Replacements(self._provider_replace)
        self._replacing = threading.Lock()

    @property
    def recovered(self) -> bool:
        return self.attempt > 0

    def record(self) -> dict:
        """What the summary and ``recovery.json`` say of the recoveries."""
        return {"recoveries": self.attempt, **asdict(self.timeline)}

    # --- while an attempt runs ---------------------------------------------------------

    def grow_back(self, backend: Backend, ctx: RunContext, since: float) -> GrowBack:
        """While the attempt runs on fewer nodes than asked: ask for the missing ones every RECOVER_WAIT seconds and,
        once all are back and the job trains (``since``: the attempt's start), give it the backend's notice."""
        here = {n.name for n in ctx.inv.nodes}
        missing = [n.name for n in self.cluster.first(self.spec.nodes).nodes if n.name not in here]

        def notify() -> bool:
            if not job_trains(ctx, since):
                return False
            at = time.time()
            if not backend.notice(ctx):
                return False
            self.timeline.add("notice", f"growing back: SIGTERM with GRACE to the ranks on {len(ctx.inv.nodes)} "
                              f"node(s)", at=at)
            return True

        self.growing = GrowBack(missing, self._replace_now, notify, self.spec.recover_wait, self.say)
        return self.growing

    def _replace_now(self, name: str) -> Inventory:
        """Growing back: ``name``'s replacement once ready (the one under way, or a new ask)."""
        cluster, done_at = self.replacements.take(name)
        self.timeline.add("node back", name, at=done_at)
        return cluster

    def _provider_replace(self, name: str) -> Inventory:
        """One provider call at a time, each from the inventory the last one wrote (replacements run on threads)."""
        with self._replacing:
            self.cluster = self.provider.replace(self.state, self.cluster, name)
            return self.cluster

    # --- between attempts ----------------------------------------------------------------

    def after(self, ctx: RunContext, outcome: Outcome, summary: RunSummary, started_at: float | None,
              resumed: dict | None) -> Inventory | None:
        """The nodes of the next attempt, or None: the run ends with this attempt."""
        if self.restart_seconds is None and started_at is not None:
            self.restart_seconds = max(0.0, started_at - self.started)
        self._resumed(started_at, resumed)
        grown, self.growing = self.growing.notified, GrowBack.idle()
        if grown:  # our own notice ended the job: every node is back
            self.grown += 1
            self._grow_stop(outcome, summary)
            self.label, self.pending = f"grow-{self.grown}", Loss([], "grow", None)
            return self.cluster.first(self.spec.nodes)
        if outcome.kind in ("succeeded", "interrupted"):
            return None
        if outcome.kind == "preempted" and (summary.preempted or {}).get("stopped_by"):
            return None  # Ctrl-C (or a scheduler) stopped the orchestrator: nothing to recover
        loss = self._what_was_lost(ctx, outcome, summary)
        if loss is None or self.attempt >= self.spec.recover:
            return None
        loss = self._with_the_batch(ctx, loss, summary)
        self.attempt += 1
        self.say(f"recovery {self.attempt}/{self.spec.recover} of run {self.spec.run_id}")
        self.label, self.pending = f"attempt-{self.attempt - 1}", loss
        return self._replace_or_shrink(ctx.inv, loss)

    def _grow_stop(self, outcome: Outcome, summary: RunSummary) -> None:
        """How the job took the notice for growing back: its coordinated checkpoint; or, when the notice met it
        where it takes none (past its last step, at exit), another ending -- the whole cluster then goes on from
        the freshest snapshot (a finished job's is its last). A bug of the job's own fails that attempt again."""
        if outcome.kind == "preempted":
            self._checkpoint_written(summary.preempted)
            return
        self.say("the notice ended the job without its checkpoint (it was finishing): the whole cluster goes on "
                 "from the freshest snapshot")
        self.timeline.add("no checkpoint", "the job failed as the notice came: going on from the freshest snapshot")

    def _what_was_lost(self, ctx: RunContext, outcome: Outcome, summary: RunSummary) -> Loss | None:
        """The node(s) to replace: the one a notice named, and every node that no longer answers SSH. None for a
        failure with every node answering: the job's own (recovery does not retry bugs)."""
        silent = self._silent(ctx.inv, ctx.runner.vanished([n.name for n in ctx.inv.nodes]))
        if outcome.kind == "preempted":
            report = summary.preempted or {}
            host = report.get("noticed_on")
            named = [n.name for n in ctx.inv.nodes if host in (n.hostname, n.name)]
            at = report.get("noticed_at")
            self.timeline.add("notice", f"{report.get('notice', 'a notice')} on {', '.join(named) or host or '?'}",
                              at=float(at) if isinstance(at, (int, float)) else None)
            stop = self._checkpoint_written(report)
            also = [n for n in silent if n not in named]
            if also:
                self.timeline.add("node lost", f"{', '.join(also)} (no SSH: {silent[also[0]]})")
            return Loss(named + also, "notice", stop.get("step"))
        if not silent:
            return None
        lost = list(silent)
        self.timeline.add("node lost", f"{', '.join(lost)} (no SSH: {silent[lost[0]]})")
        alive = [n.name for n in ctx.inv.nodes if n.name not in silent]
        return Loss(lost, "lost", self._last_step(ctx, alive))

    def _with_the_batch(self, ctx: RunContext, loss: Loss, summary: RunSummary) -> Loss:
        """Notices come in batches: after the coalescing window, every other node of the attempt with a spot
        interruption notice joins this recovery (:mod:`multinode.app.notices`)."""
        if loss.cause != "notice":
            return loss
        at = (summary.preempted or {}).get("noticed_at")
        found = notices.collect(ctx, float(at) if isinstance(at, (int, float)) else None, self.started)
        more = [name for name in found if name not in loss.nodes]
        if not more:
            return loss
        self.timeline.add("notice", f"spot interruption notice on {', '.join(more)} (within the "
                          f"{notices.COALESCE_SECONDS:g} s window: the same recovery)")
        self.say(f"{', '.join(more)} got a notice too (within {notices.COALESCE_SECONDS:g} s of the first): one "
                 f"recovery replaces {', '.join(loss.nodes + more)}")
        return replace(loss, nodes=loss.nodes + more)

    def _silent(self, active: Inventory, gone: dict[str, str]) -> dict[str, str]:
        """{node: why} for the nodes that answer neither SSH probe (PROBE_SECONDS), each on a new connection (the
        run's may be stale): a node busy enough to miss the first is not lost -- replacing it would wipe its
        snapshots. One of ``gone`` (the provider knows its machine is gone: ``Provider.gone``) is lost without a
        probe."""
        rest = [n.name for n in active.nodes if n.name not in gone]
        first = probe_ssh(active.only(rest), timeout=PROBE_SECONDS[0]) if rest else {}
        doubt = [name for name, (ok, _why) in first.items() if not ok]
        again = probe_ssh(active.only(doubt), timeout=PROBE_SECONDS[1]) if doubt else {}
        lost = {**gone, **{name: why for name, (ok, why) in again.items() if not ok}}
        return {n.name: lost[n.name] for n in active.nodes if n.name in lost}

    def _checkpoint_written(self, report: dict | None) -> dict:
        """The coordinated checkpoint of a PREEMPTED report on the timeline, at the time it was written (now if the
        report does not say); its ``stopped_at``."""
        report = report or {}
        stop = report.get("stopped_at") or {}
        self.timeline.add("checkpoint written", f"step {stop.get('step')}, {report.get('checkpoint_seconds', '?')} s",
                          at=checkpoint_time(report))
        return stop

    def _last_step(self, ctx: RunContext, alive: list[str]) -> int | None:
        """The highest optimizer step a surviving rank reached (our trainer's heartbeat files hold it)."""
        commands = {name: f"cat {node_run_dir(ctx.inv, name, self.spec.run_id)}/heartbeat-rank* 2>/dev/null; true"
                    for name in alive}
        answers = ctx.runner.run_each(commands, timeout=10)
        steps = [int(tok) for res in answers.values() for tok in res.stdout.split() if tok.isdigit()]
        return max(steps) if steps else None

    def _replace_or_shrink(self, active: Inventory, loss: Loss) -> Inventory | None:
        """Each lost node replaced within RECOVER_WAIT, or the run goes on without it; None when no node is left."""
        keep = [n.name for n in active.nodes]
        wait = wait_seconds(self.estimate and self.estimate.seconds, self.restart_seconds, self.spec.recover_wait)
        for name in loss.nodes:
            self.timeline.add("replacement asked", f"{name} ({self._waiting(wait)})")
            self.say(f"{name} {'got a notice' if loss.cause == 'notice' else 'is lost'}: asking "
                     f"{self.cluster.provider} for a replacement ({self._waiting(wait)})")
            self.replacements.ask(name)
            new, why, done_at = self.replacements.wait(name, wait)
            if new is not None:
                self.timeline.add("node ready", name, at=done_at)
                self.say(f"{name} replaced (the other nodes untouched)")
                continue
            if why == "still under way":
                why = (f"no replacement within RECOVER_WAIT={wait:.0f} s" if wait else
                       "its replacement is under way; the run grows back when it is ready")
            keep.remove(name)
            self.timeline.add("going on without it", f"{name}: {why}")
            self.say(f"{name}: {why}; going on with {len(keep)} node(s) at the same global batch")
        return self.cluster.only(keep) if keep else None

    def _waiting(self, wait: float) -> str:
        """The wait-or-shrink decision in words (:func:`multinode.app.replacements.wait_seconds`)."""
        takes = f"it takes {self.estimate.describe()}" if self.estimate else "the provider cannot say how long it takes"
        if wait or self.estimate is None or self.restart_seconds is None:
            return f"waiting at most {wait:.0f} s; {takes}"
        return (f"{takes}, longer than a restart of the job, about {self.restart_seconds:.0f} s: going on without it "
                "at once")

    def _resumed(self, started_at: float | None, resumed: dict | None) -> None:
        """The attempt that recovered from ``pending`` on the timeline; steps lost = the last step reached - the
        step resumed from."""
        loss, self.pending = self.pending, None
        if loss is None or started_at is None:  # the first attempt, or one that ended before its job started
            return
        resumed = resumed or {}
        self.timeline.add("job started again", f"from step {resumed.get('step', '?')} on "
                          f"{resumed.get('world_size', '?')} rank(s)", at=started_at)
        self.say(f"the job started again from {snapshot_kind(resumed)}")
        if loss.last_step is not None and isinstance(resumed.get("step"), int):
            self.timeline.steps_lost.append(max(0, loss.last_step - resumed["step"]))

    def keep_attempt(self, run_dir: Path) -> None:
        """The ended attempt's logs and summary moved to ``attempt-<k>/`` or ``grow-<k>/`` (the next attempt writes
        the same names)."""
        keep = run_dir / self.label
        keep.mkdir(parents=True, exist_ok=True)
        for path in list(run_dir.iterdir()):
            if not path.name.startswith(("attempt-", "grow-")):
                shutil.move(str(path), keep / path.name)


def snapshot_kind(resumed: dict) -> str:
    """The snapshot a recovered job resumed from (its ``RESUMED`` report) in words: whose, which step, where."""
    where = resumed.get("snapshot_from", "?")
    if not isinstance(resumed.get("step"), int):
        return "no snapshot (a fresh start)"
    if resumed.get("survivor"):
        return f"the surviving ranks' snapshot of step {resumed['step']} (their last completed step, epoch {resumed.get('epoch')}), {where}"
    if resumed.get("consumed"):
        return (f"the coordinated checkpoint of step {resumed['step']} (epoch {resumed.get('epoch')}, "
                f"{resumed['consumed']} samples in), {where}")
    return f"the periodic snapshot of step {resumed['step']} (before epoch {resumed.get('epoch')}), {where}"
