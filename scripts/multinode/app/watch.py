"""One attempt's job, watched until it ends: the run's one loop, where every decision during an attempt is taken.

The backend starts the job and hands back its :class:`~multinode.backends.base.JobHandle` (the mechanism: the
parts, their stop, their notice); the parts, the watchers and the replacements put typed events on the attempt's
queue (:mod:`multinode.core.events`); this loop takes them one at a time and decides, the same for SSH and SLURM:

* a part that ends 0 or 75 is done; every part done: the job ended by itself;
* a part that fails, a node lost or gone (the provider's word, asked every :data:`GONE_POLL` s: a vanished machine
  ends no SSH session), a stall (the watchdog's), the deadline, or a job the scheduler cannot run: **the failure**
  -- the lost nodes' connections cut on the others (their collectives fail at once instead of at the
  process-group timeout: :meth:`~multinode.ssh.runner.RemoteRunner.cut_off`), the run's look at the live ranks
  (``capture``), then the gang-stop: every part stopped, the ones that do not end within :data:`LOST_GRACE` (or do
  not even answer the stop) dropped and named lost;
* an elastic job's node (MAX_RESTARTS) that is lost or killed, while it has relaunches left and is not the head:
  **relaunched** (it waits for the node to answer again; torchrun's rendezvous takes it back);
* a stop signal to the orchestrator (Ctrl-C, SIGTERM, SIGHUP): with GRACE **a notice** to every rank (one
  coordinated checkpoint, exit 75), the parts followed for GRACE + 2 s more, then stopped; without GRACE, stopped;
* fewer nodes than the cluster has (``grow``: :class:`multinode.app.growback.GrowBack`): a replacement that comes
  ready is taken in; once every missing node is back and the job trains, **the grow-back notice**.

What the job's parts report is read once, here: the channel's records (:mod:`training.channel`) from the output
lines -- step times to the slow-rank reader, marks (the first says the job trains) -- and kept off the console.
The loop's :class:`~multinode.core.outcome.Ending` goes to the backend, which makes the attempt's
:class:`~multinode.core.outcome.Outcome` of it (the exit codes, and a scheduler's own account, are its).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from multinode.app.changes import Changes
from multinode.app.growback import GrowBack
from multinode.app.members import Members
from multinode.app.watchers import GoneWatch, Rejoin, frozen
from multinode.backends.base import Backend, JobHandle, JobPlan, RunContext
from multinode.core.errors import EXIT_PREEMPTED, NodeError
from multinode.core.events import (Events, JobEnded, JobError, JobRecord, NodeEnded, NodeGone, ReplacementReady,
                                   ReplacementRefused, Stalled)
from multinode.core.outcome import Ending, Outcome
from multinode.diagnose.slowranks import SlowRanks
from multinode.diagnose.watchdog import StallWatchdog
from multinode.ssh.signals import StopSignals
from multinode.trainer import channel

TICK = 0.2  # seconds the loop waits for an event before it looks at the clocks
LOST_GRACE = 15.0  # after a stop, how long a part may take to end before it is dropped


class AttemptLoop:
    """One attempt's job from its start to its outcome (see the module doc)."""

    def __init__(self, ctx: RunContext, backend: Backend, plan: JobPlan, *, gone: Callable[[list[str]], dict],
                 capture: Callable[[NodeError, tuple[str, ...]], object], slow: SlowRanks,
                 watchdog: StallWatchdog | None = None, rejoin: Rejoin | None = None, grow: GrowBack | None = None,
                 confirm: Callable[[RunContext, list[str], dict[str, str]], dict[str, str]] | None = None,
                 recovery=None, prepare: Callable[[str], None] | None = None) -> None:
        self.ctx, self.backend, self.plan = ctx, backend, plan
        self.ask_gone, self.capture, self.slow, self.rejoin = gone, capture, slow, rejoin
        self.watchdog, self.confirm, self.recovery, self.prepare = watchdog, confirm, recovery, prepare
        self.grow = grow or GrowBack.idle()
        self.changes: Changes | None = None  # membership changes inside the attempt (RECOVER, our helper's jobs)
        self.last_seen: dict[str, float] = {}  # each node's last line: its last sign of life
        self.events = Events()
        self.say = ctx.runner.say
        self.trains = threading.Event()  # a mark of this attempt's job came: it trains (the grow-back's notice)
        self.gone: dict[str, str] = {}  # the nodes the provider said are gone, and why
        self.frozen: dict[str, str] = {}  # the nodes whose ranks the stacks showed frozen at a stall, and why
        self.relaunches: dict[str, int] = {}
        self.job: JobHandle | None = None
        self._noticing = threading.Event()  # the grow-back notice is on its way
        self._notice_thread: threading.Thread | None = None

    def observe(self, node: str, line: str) -> bool:
        """Every line of the job's output as it arrives: True for the channel's records the run reads (kept off
        the console; the node logs keep them)."""
        self.last_seen[node] = time.time()
        record = channel.parse(line)
        if record is None:
            return False
        if record.kind == channel.STEPTIMES:
            return self.slow.take(node, record)
        if record.kind == channel.MARK:
            self.trains.set()
            return True
        if record.kind in (channel.WORLD, channel.KEPT, channel.JOINING, channel.WAITING, channel.NOTICE):
            self.events.put(JobRecord(node, record.kind, record.data))  # the membership's: the loop's to act on
            return True
        return False

    def run(self) -> Outcome:
        """Start the job and watch it until it ends; how it ended. A job that cannot start is a failed outcome."""
        try:
            self.job = self.backend.start(self.ctx, self.plan, self.events, self.observe)
        except NodeError as err:
            return Outcome("failed", {n.name: None for n in self.ctx.inv.nodes}, failure=err, failures=(err,))
        members = Members.of(self.ctx, self.plan, self.say)
        if self.recovery is not None and not members.enabled:
            self.recovery.say(f"a lost or noticed node restarts every process of this run: {members.reason}")
        if members.enabled and self.recovery is not None:
            # The look at silent members runs on a thread of its own: the backend's look itself, not the run's
            # (which keeps its capture as the attempt's, for a failure's summary).
            look = lambda failure, lost: self.backend.reach.capture(self.ctx, failure, lost)  # noqa: E731
            self.changes = Changes(self.ctx, self.job, members, self.recovery, self.prepare, self.say,
                                   self.last_seen, look, self.events)
            self.recovery.replacements.listen(self.events)
        watch = GoneWatch(self.ask_gone, [n.name for n in self.ctx.inv.nodes], self.events).start()
        if self.watchdog is not None:
            self.watchdog.start(self.events)
        self.grow.begin(self.events)
        try:
            with StopSignals() as signals:
                ending = self._loop(signals)
        finally:
            watch.stop()
            members.settle()  # no generation of this attempt written after it ended (the next one clears them first)
            if self.watchdog is not None:
                self.watchdog.stop()
            if self._notice_thread is not None:  # the job ended under the grow-back notice: its answer first
                self._notice_thread.join(timeout=self.ctx.runner.stop.kill_after + 10)
            self.grow.end()
            if self.changes is not None:
                self.changes.stays.join(timeout=self.ctx.runner.stop.kill_after + 10)  # a head's stop, done first
                self.recovery.replacements.listen(None)
            self.job.close()
        outcome = self.job.outcome(ending)
        if self.changes is not None and outcome.kind == "preempted" and ending.stopped_by is None \
                and not self.grow.notified:  # a node's notice stopped every rank: one that could not leave alone
            self.changes.why_not(self.changes.members.names[0])
        if self.confirm is not None and outcome.lost:  # a recovering run replaces only what is lost indeed
            lost = self.confirm(self.ctx, list(outcome.lost), {**self.gone, **self.frozen})
            outcome = replace(outcome, lost=tuple(lost), why_lost=lost)
        return outcome

    # --- the loop -----------------------------------------------------------------------------------------------

    def _loop(self, signals: StopSignals) -> Ending:
        job, pending = self.job, set(self.job.parts)
        end = None if self.ctx.spec.deadline is None else time.monotonic() + self.ctx.spec.deadline
        while pending:
            if signals.signum is not None:
                return self._signalled(signals.signum, pending)
            event = self.events.take(TICK)
            if event is None:
                if self.changes is not None:
                    self.changes.tick(pending)
                if end is not None and time.monotonic() > end:
                    why = f"deadline of {self.ctx.spec.deadline:.0f} s passed"
                    return self._fail("failed", NodeError(job.parts[0], "job", None, f"{why}; the job was stopped"),
                                      why, pending)
                self._grow_tick()
                continue
            if self._changed(event, pending):
                continue
            if isinstance(event, NodeEnded):
                failure = self._part_ended(event, pending)
                if failure is not None:
                    kind = "lost" if event.lost else "failed"
                    return self._fail(kind, failure, f"{event.node} failed ({failure.message})", pending)
            elif isinstance(event, JobEnded):
                return Ending()
            elif isinstance(event, JobError):
                return self._fail("failed", event.error, event.error.message, pending)
            elif isinstance(event, NodeGone):
                self.gone[event.node] = event.why
                failure = job.fail_node(event.node, f"is gone ({event.why})", lost=True)
                if failure is not None:
                    pending.discard(event.node)
                    job.drop(event.node)  # its session would wait on a connection no answer will ever come back on
                    return self._fail("lost", failure, f"{event.node} failed ({failure.message})", pending)
            elif isinstance(event, Stalled):
                head = job.parts[0]
                return self._fail("stalled", NodeError(head, "job", None, f"{event.why}; the job was stopped"),
                                  event.why, pending)
            elif isinstance(event, (ReplacementReady, ReplacementRefused)):
                self.grow.take(event)
                self._grow_tick()
        return Ending()

    def _part_ended(self, event: NodeEnded, pending: set[str]) -> NodeError | None:
        """A part ended: None when it ended well (0, or 75: its ranks stopped on a notice) or was relaunched; else
        its failure. The part is no longer pending unless relaunched."""
        failure = event.error
        if failure is None and event.exit_code not in (0, None, EXIT_PREEMPTED):
            peer = ", its collective failed: a peer gone or slower than PG_TIMEOUT" \
                if event.exit_code == channel.EXIT_PEER_FAILED else ""
            failure = self.job.fail_node(event.node, f"exited with code {event.exit_code}{peer}", lost=False)
        if failure is not None and self.rejoin is not None and \
                self.rejoin.allows(event, self.relaunches.get(event.node, 0)):
            self.relaunches[event.node] = self.relaunches.get(event.node, 0) + 1
            self.say(f"{event.node} {failure.message}: starting it again when it answers "
                     f"(relaunch {self.relaunches[event.node]}/{self.rejoin.budget})")
            self.job.relaunch(event.node, self.rejoin.wait, self.rejoin.prepare)
            return None
        pending.discard(event.node)
        return failure

    def _changed(self, event, pending: set[str]) -> bool:
        """An event a membership change takes (:meth:`multinode.app.changes.Changes.take`): True when it did, and
        the job goes on in its processes; False for the loop's other decisions (the restart path among them)."""
        return self.changes is not None and self.changes.take(event, pending, self.capture, self._lost(), self.gone)

    # --- decisions ----------------------------------------------------------------------------------------------

    def _lost(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.job.lost()) | set(self.gone)))

    def _fail(self, kind: str, failure: NodeError, why: str, pending: set[str]) -> Ending:
        """Say why, cut the lost nodes off, give the run its look at the live ranks, stop the job everywhere."""
        self.say(f"{why}: stopping the job on every node")
        for name, reason in self.ask_gone([n.name for n in self.ctx.inv.nodes if n.name not in self.gone]).items():
            self.gone[name] = reason  # a machine gone: lost, neither looked at nor asked
            self.job.fail_node(name, f"is gone ({reason})", lost=True)
        lost = self._lost()
        self.ctx.runner.cut_off(lost, [n.name for n in self.ctx.inv.nodes if n.name not in lost])
        try:
            captured = self.capture(failure, lost)
            found = frozen(captured, self.job.parts[0]) if kind == "stalled" else None
            if found is not None:  # a node whose ranks are frozen is lost, whatever SSH says
                self.frozen[found[0]] = found[1]
                self.job.fail_node(found[0], found[1], lost=True)
        except Exception as err:  # a diagnosis that fails must not leave the job running
            self.say(f"before the stop: {type(err).__name__}: {err}")
        self._gang_stop(pending)
        return Ending(kind, failure, self._lost())

    def _gang_stop(self, pending: set[str], name_failures: bool = True) -> None:
        """Stop the job everywhere, then give the parts still running :data:`LOST_GRACE` to end. A node that
        does not even answer the stop is unreachable -- crashed, cut off, or vanished just after its part ended (a
        machine lost at once delivers its killed processes' exit, 137, before its SSH goes, and before the provider
        says "gone") -- dropped at once and (``name_failures``) named lost, which makes it the likely root cause."""
        asked = [n for n in self.job.parts if n not in self.gone]
        answered = self.job.stop(asked)
        silent = {name for name in asked if not answered.get(name, False)}  # running or not, its machine is silent
        unreachable = silent | (pending & set(self.gone))
        self._wait_for(pending, unreachable, time.monotonic() + LOST_GRACE)
        for name in sorted(pending | silent):
            why = f"did not end within {LOST_GRACE:.0f} s of the stop"
            if name in unreachable:
                why = f"is gone ({self.gone[name]})" if name in self.gone else \
                    "stopped answering (unreachable: no answer to the stop)"
            self.say(f"{name}: {why}; dropping its connection")
            if name_failures:
                self.job.fail_node(name, why, lost=name in unreachable)
            self.job.drop(name)

    def _wait_for(self, pending: set[str], skip: set[str], until: float) -> None:
        """Until every part of ``pending`` but ``skip`` ended (or the job did), or ``until``."""
        while pending - skip and time.monotonic() < until:
            event = self.events.take(TICK)
            if isinstance(event, NodeEnded):
                pending.discard(event.node)
            elif isinstance(event, (JobEnded, JobError)):
                pending.clear()

    def _signalled(self, signum: int, pending: set[str]) -> Ending:
        """A stop signal: with GRACE a notice first, the parts given GRACE + 2 s to end by themselves, then stopped
        (``cancelled``); without GRACE stopped at once."""
        name = signal.Signals(signum).name
        grace = self.ctx.runner.stop.grace
        if grace is None:
            what = "interrupted" if signum == signal.SIGINT else f"stopped by {name}"
            self.say(f"{what}: stopping the job on every node")
            self._gang_stop(pending, name_failures=False)
            return Ending(stopped_by=signum, cancelled=True)
        self.say(f"{name}: a notice to every rank ({self.job.notice_words}; GRACE={grace:g} s to checkpoint, then "
                 f"SIGKILL)")
        threading.Thread(target=self.job.notice, name="mn-notice", daemon=True).start()
        self._wait_for(pending, set(), time.monotonic() + grace + 2)
        if pending:
            self._gang_stop(pending, name_failures=False)
        return Ending(stopped_by=signum, noticed=True, cancelled=bool(pending))

    # --- growing back ---------------------------------------------------------------------------------------------

    def _grow_tick(self) -> None:
        """Fewer nodes than the cluster has: ask for a missing one when it is time; once every missing node is back
        and the job trains, give it the notice (one coordinated checkpoint; the run resumes on the whole cluster)."""
        self.grow.tick(time.monotonic())
        if self.grow.ready and not self.grow.notified and not self._noticing.is_set() and \
                (self.ctx.spec.script is not None or self.trains.is_set()):
            self._noticing.set()  # the notice takes up to GRACE: on a thread, the loop goes on watching
            self._notice_thread = threading.Thread(target=self._grow_notice, name="mn-grow-notice", daemon=True)
            self._notice_thread.start()

    def _grow_notice(self) -> None:
        at = time.time()
        if self.job.notice():
            self.grow.noticed(len(self.ctx.inv.nodes), at)
        else:
            self._noticing.clear()  # the job was not there to take it (starting, or gone): again at a later tick
