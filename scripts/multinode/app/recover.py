"""``RECOVER=N``: what a run does between its attempts when one ends preempted or with a lost node, at most N times.

    attempt -> (preempted | a node lost) -> replace that node only -> next attempt from the freshest snapshot
                                          \\-> refused or slow (RECOVER_WAIT) -> go on without it
    attempt on fewer nodes -> (grow-back's notice, every node back) -> next attempt on the whole cluster

The attempts are the run's (:class:`multinode.app.run.Run`), all of one run id (the nodes' snapshots live under
it): pre-flight, sync and setup are incremental, only a new node receives the code. :meth:`Recovery.after` reads
how an attempt ended (its :class:`~multinode.core.outcome.Outcome`, summary) and answers with the next attempt's
nodes, or None for the end of the run:

1. **what was lost** is the outcome's: the noticed node (rank 0's report, by host name), or the nodes the attempt's
   loop found lost and confirmed (no SSH, or the provider's word that the machine is gone); the decision is
   :func:`multinode.app.decide.decide`, pure: a failure with every node answering is the job's own (not retried)
   unless only its collectives failed (every process again, on the same nodes);
2. **replace it** (the provider's ``replace``; the other nodes untouched), waiting at most ``RECOVER_WAIT`` s, or
   not at all when it takes longer than a restart (:mod:`multinode.app.replacements`); a refusal or a slow one
   leaves the run to **go on with the nodes it has** at the same global batch (``training/sampler.py``);
3. **resume**: the next attempt (a new head if node-0 was lost) starts from the freshest complete snapshot on any
   surviving node; on fewer nodes, :meth:`Recovery.grow_back` gives the loop the missing ones to take back
   (:mod:`multinode.app.growback`), then the job the notice.

The :class:`~multinode.app.timeline.Timeline` (notice or loss -> checkpoint -> replacement asked -> node ready -> job
started again, with times and steps lost) goes into the summary and ``recovery.json``; logs under ``attempt-<k>/``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from multinode.app import notices
from multinode.app.decide import Decision, Ended, History, decide
from multinode.app.growback import GrowBack
from multinode.app.replacements import Replacements, wait_seconds
from multinode.app.timeline import Timeline, checkpoint_time, snapshot_kind
from multinode.backends.base import RunContext
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.core.outcome import Outcome
from multinode.core.rundir import RunDir
from multinode.core.state import ClusterState
from multinode.diagnose.summary import RunSummary
from multinode.providers import get_provider
from multinode.trainer import channel



@dataclass(frozen=True)
class Loss:
    """Why an attempt ended: the nodes to replace, and what the run knew about its last step."""

    nodes: list[str]
    cause: str  # "notice" | "lost" | "grow" | "collective"
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

    def grow_back(self, ctx: RunContext) -> GrowBack:
        """The attempt's grow-back (its loop runs it): the nodes it runs without, asked for every RECOVER_WAIT s."""
        here = {n.name for n in ctx.inv.nodes}
        missing = [n.name for n in self.cluster.first(self.spec.nodes).nodes if n.name not in here]
        if not missing:
            self.growing = GrowBack.idle()
        else:
            self.growing = GrowBack(missing, self.replacements, self.spec.recover_wait, self.say, self._back,
                                    self._grew)
        return self.growing

    def _grew(self, nodes: int, at: float) -> None:  # the grow-back notice reached the job: on the timeline
        self.timeline.add("notice", f"growing back: SIGTERM with GRACE to the ranks on {nodes} node(s)", at=at)

    def may_recover(self) -> bool:
        """Whether RECOVER has a recovery left."""
        return self.attempt < self.spec.recover

    def left_in_process(self, name: str, cause: str, why: str, at: float, survivors: int) -> None:
        """A node left the running job (:mod:`multinode.app.changes`; ``cause``: notice, lost, or let go -- its
        replacement, beside it, is ready): a recovery, on the timeline from the loss or the notice; a replacement."""
        self.attempt += 1
        said, event = {"notice": ("left on a notice", "notice"), "lost": ("is lost", "node lost"),
                       "let go": ("was let go", "node let go")}[cause]
        asked = "its replacement takes its place" if cause == "let go" else \
            f"asking {self.cluster.provider} for a replacement"
        self.say(f"recovery {self.attempt}/{self.spec.recover} of run {self.spec.run_id}: {name} {said} ({why}); the "
                 f"{survivors} other node(s) go on in their processes; {asked}")
        self.timeline.add(event, f"{name} ({why})", at=at)
        self.timeline.add("replacement asked", name)
        self.replacements.ask(name)

    def reformed(self, why: str, at: float, nodes: int) -> None:
        """Every rank paused, no node gone (:meth:`multinode.app.changes.Changes._again`): a recovery in-process."""
        self.attempt += 1
        self.say(f"recovery {self.attempt}/{self.spec.recover} of run {self.spec.run_id}: {why}; the same {nodes} "
                 f"node(s) form the job again in their processes")
        self.timeline.add("collective failed", why, at=at)

    def world_changed(self, world: dict, at: float) -> None:
        """The ranks' WORLD record of a new generation: on the timeline."""
        joined = ", ".join(world.get("joined") or [])
        what = f"{joined} joined" if joined else f"world {world.get('before')} -> {world.get('world_size')}"
        self.timeline.add("world changed", f"{what} at step {world.get('step')} ({world.get('seconds')} s after the "
                                           f"pause; no process restarted)", at=at)
        self.say((f"{what} rank(s) at step {world.get('step')}, {world.get('seconds')} s after the pause, every "
                  f"surviving process kept" if not joined else f"{joined} joined the running job at step "
                  f"{world.get('step')}; the ranks paused {world.get('seconds')} s") + _parts(world))

    def _back(self, name: str, at: float) -> None:
        self.timeline.add("node back", name, at=at)

    def _provider_replace(self, name: str, retire: Callable[[], None] | None = None) -> Inventory:
        """One provider call at a time, each from the inventory the last one wrote (replacements run on threads)."""
        with self._replacing:
            self.cluster = self.provider.replace(self.state, self.cluster, name, retire=retire)
            return self.cluster

    # --- between attempts ----------------------------------------------------------------

    def after(self, ctx: RunContext, outcome: Outcome, summary: RunSummary, started_at: float | None,
              resumed: dict | None) -> Inventory | None:
        """The nodes of the next attempt, or None: the run ends with this attempt."""
        if self.restart_seconds is None and started_at is not None:
            self.restart_seconds = max(0.0, started_at - self.started)
        self._resumed(started_at, resumed)
        grew, self.growing = self.growing.notified, GrowBack.idle()
        report = summary.preempted or {}
        noticed = tuple(n.name for n in ctx.inv.nodes if report.get("noticed_on") in (n.hostname, n.name))
        wait = wait_seconds(self.estimate and self.estimate.seconds, self.restart_seconds, self.spec.recover_wait)
        decision = decide(Ended(outcome.kind, outcome.stopped_by, outcome.lost, noticed, grew, outcome.peers_failed),
                          History(self.attempt, self.spec.recover, len(ctx.inv.nodes), wait))
        if decision.action == "end":
            return None
        if decision.action == "grow back":
            return self._grow(outcome, summary)
        loss = self._loss(ctx, outcome, decision, report)
        loss = self._with_the_batch(ctx, loss, summary)
        self.attempt += 1
        self.say(f"recovery {self.attempt}/{self.spec.recover} of run {self.spec.run_id}")
        self.label, self.pending = RunDir.kept_label("attempt", self.attempt - 1), loss
        return self._replace_or_shrink(ctx.inv, loss, wait)

    def _grow(self, outcome: Outcome, summary: RunSummary) -> Inventory:
        """Our own notice ended the job: every node is back, the next attempt runs on the whole cluster."""
        self.grown += 1
        self._grow_stop(outcome, summary)
        self.label, self.pending = RunDir.kept_label("grow", self.grown), Loss([], "grow", None)
        return self.cluster.first(self.spec.nodes)

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

    def _loss(self, ctx: RunContext, outcome: Outcome, decision: Decision, report: dict) -> Loss:
        """The decision's nodes as a Loss, on the timeline: a notice (and its checkpoint), the nodes lost, or none
        (only the collectives failed: the same nodes again, from the freshest snapshot)."""
        if decision.cause == "collective":
            self.timeline.add("collective failed", decision.why)
            self.say(f"{decision.why}: every process starts again on the same {len(ctx.inv.nodes)} node(s)")
            return Loss([], "collective", self._last_step(ctx, [n.name for n in ctx.inv.nodes]))
        lost = [n for n in decision.nodes if n in outcome.lost]
        why = outcome.why_lost.get(lost[0], "no SSH") if lost else ""
        if decision.cause == "notice":
            named = [n for n in decision.nodes if n not in lost]
            at = report.get("noticed_at")
            self.timeline.add("notice", f"{report.get('notice', 'a notice')} on "
                                        f"{', '.join(named) or report.get('noticed_on') or '?'}",
                              at=float(at) if isinstance(at, (int, float)) else None)
            stop = self._checkpoint_written(report)
            if lost:
                self.timeline.add("node lost", f"{', '.join(lost)} ({why})")
            return Loss(list(decision.nodes), "notice", stop.get("step"))
        self.timeline.add("node lost", f"{', '.join(lost)} ({why})")
        alive = [n.name for n in ctx.inv.nodes if n.name not in lost]
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
        commands = {name: f"cat {channel.heartbeat_glob(node_run_dir(ctx.inv, name, self.spec.run_id))} 2>/dev/null; "
                          f"true" for name in alive}
        answers = ctx.runner.run_each(commands, timeout=10)
        steps = [step for res in answers.values() for step in channel.heartbeat_steps(res.stdout)]
        return max(steps) if steps else None

    def _replace_or_shrink(self, active: Inventory, loss: Loss, wait: float) -> Inventory | None:
        """Each lost node replaced within ``wait`` seconds, or the run goes on without it; None when none is left."""
        keep = [n.name for n in active.nodes]
        for name in loss.nodes:
            waiting = "launched beside it already: waiting for the old machine to go and the new one to be made" \
                if self.replacements.launched(name) else self._waiting(wait)
            self.timeline.add("replacement asked", f"{name} ({waiting})")
            self.say(f"{name} {'got a notice' if loss.cause == 'notice' else 'is lost'}: asking "
                     f"{self.cluster.provider} for a replacement ({waiting})")
            self.replacements.ask(name)
            done = self.replacements.wait(name, wait)
            if done is not None and done.refused is None:
                self.timeline.add("node ready", name, at=done.at)
                self.say(f"{name} replaced (the other nodes untouched)")
                continue
            why = done.refused if done is not None else (
                f"no replacement within RECOVER_WAIT={wait:.0f} s" if wait else
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
        """The attempt that recovered from ``pending`` on the timeline; steps lost: the last reached - the resumed."""
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
        """The ended attempt's logs and summary moved to ``attempt-<k>/`` or ``grow-<k>/`` (the next: the same)."""
        RunDir(run_dir).keep(self.label)


def _parts(world: dict) -> str:
    """Where rank 0's pause went (its WORLD record's parts: leave, wait, form, sync, rebuild), or nothing."""
    parts = world.get("parts")
    return f" ({', '.join(f'{k} {v}' for k, v in parts.items())})" if isinstance(parts, dict) and parts else ""
