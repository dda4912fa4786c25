"""One command on every node at once, watched until it ends: the job of the SSH backend, and SETUP.

The runner (:mod:`multinode.ssh.runner`) keeps the connections, shells and short commands; this module owns a
running job. Contract:

* every node's command runs in one of its shells (:mod:`multinode.ssh.shell`) with ``MULTINODE_RUN_ID``
  exported; its output is re-assembled into whole lines (:class:`LineSink`), so lines of different nodes never
  interleave mid-line; each goes to ``<log_dir>/<node>.log`` and, prefixed ``[node-i]``, to the console (but for
  the lines the caller's ``observe`` reads: the trainer's step times, which only the log keeps);
* the run ends as one :class:`~multinode.core.outcome.Outcome`, never an exception: every node ended 0 or 75
  (succeeded, or preempted); the first node that exits non-zero (failed), loses its SSH session or whose machine
  the provider says is gone (lost: asked every GONE_POLL s, a vanished machine ends no session), a deadline
  (failed) or a stall (``stalled``: stalled) stops the job on every node first (processes whose environment carries
  the run id: torchrun starts workers in their own session, so a process-tree or process-group kill would miss
  them); before that stop the caller's ``before_stop`` hook may look at the live ranks. Ctrl-C/SIGTERM/SIGHUP to
  the orchestrator stop it too (interrupted);
* built on :class:`multinode.ssh.runner.RemoteRunner` (its shells and its stop policy); the runner knows nothing of it;
* elastic jobs (``rejoin``): a node whose session is lost or whose launcher is killed by a signal is not a
  failure while it has restarts left. The run stops what is left of it on that node, waits for the node to
  answer SSH again (rebooted or replaced), lets the caller prepare it (code sync) and starts its command again;
  torchrun's rendezvous takes it back in. A launcher that exits with its own error code is a failure;
* parallelism is plain daemon threads joined with deadlines: a node that stops answering can delay the run
  by at most the deadline, never hang it;
* with GRACE (the runner's :class:`~multinode.ssh.runner.StopPolicy`), every stop gives the processes that long
  between SIGTERM and SIGKILL, and Ctrl-C/SIGTERM/SIGHUP to the orchestrator is a notice: the ranks get SIGTERM,
  write one coordinated checkpoint and exit 75; when every node ends with 0 or 75 the job is preempted (its
  ``stopped_by`` names the signal), otherwise interrupted. :meth:`JobRun.notice` is that notice, for a caller
  (growing back) that wants the ranks to checkpoint and stop while the job goes on being watched.
"""

from __future__ import annotations

import logging
import queue
import shlex
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from multinode.core.errors import EXIT_PREEMPTED, NodeError
from multinode.core.outcome import Outcome
from multinode.ssh.connect import describe_ssh_error
from multinode.ssh.runner import RemoteRunner
from multinode.ssh.lines import LineSink, Relabel
from multinode.ssh.shell import TextSink
from multinode.ssh.signals import StopRequested, StopSignals
from multinode.trainer import channel

log = logging.getLogger(__name__)

TAIL_LINES = 20
LOST_GRACE = 15.0  # after a stop, how long a node's session may take to end before we drop it
# How often a running job asks whether a node's machine is gone (a vanished machine ends no SSH session). EC2: a
# DescribeInstances, 2.5 % of a non-mutating action's 20/s refill (docs.aws.amazon.com/ec2/latest/devguide/).
GONE_POLL = 2.0


@dataclass
class NodeResult:
    """How one node's part of a job ended."""

    node: str
    exit_code: int | None = None  # None: lost (SSH died) or never finished
    started: float = 0.0
    finished: float | None = None
    error: NodeError | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lost: bool = False  # the SSH session died (node down or cut off), as opposed to an exit code
    relaunches: int = 0  # times the runner started this node's command again (elastic jobs)

    @property
    def killed(self) -> bool:
        """Lost, or the launcher died by a signal (SSH reports -1; a shell, 128 + signal)."""
        return self.lost or self.exit_code is None or self.exit_code < 0 or self.exit_code >= 128


@dataclass(frozen=True)
class Rejoin:
    """Elastic policy for :meth:`RemoteRunner.run`: which nodes may be started again, how often, how."""

    budget: int  # relaunches allowed per node
    wait: float  # seconds a lost node has to answer SSH again
    prepare: Callable[[str], None] = lambda name: None  # e.g. sync the code again (a replaced node has none)
    exclude: tuple[str, ...] = ()  # nodes whose loss ends the job (the head: it hosts the rendezvous)


class JobRun:
    """``command_lines[node]`` (one shell line per node) on every node of ``runner`` at once, under run id ``run_id`` (see the module doc)."""

    def __init__(self, runner: RemoteRunner, command_lines: dict[str, str], *, run_id: str, log_dir: Path,
                 deadline: float | None = None, extra_stop: Callable[[str], str | None] | None = None,
                 relabel: Relabel | None = None, rejoin: Rejoin | None = None,
                 before_stop: Callable[[NodeError, tuple[str, ...]], None] | None = None,
                 stalled: Callable[[], str | None] | None = None, observe: Callable[[str, str], bool] | None = None):
        self.runner, self.command_lines, self.run_id, self.log_dir = runner, command_lines, run_id, log_dir
        self.deadline, self.extra_stop, self.relabel, self.rejoin = deadline, extra_stop, relabel, rejoin
        self.before_stop, self.stalled, self.observe = before_stop, stalled, observe
        self.results = {name: NodeResult(name) for name in command_lines}
        self.events: queue.Queue[str] = queue.Queue()
        self.log_files: dict[str, TextIO] = {}

    def run(self) -> Outcome:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_files = {name: open(self.log_dir / f"{name}.log", "a", encoding="utf-8") for name in self.command_lines}
        with StopSignals() as stop:
            for name in self.command_lines:
                self.start(name)
            try:
                kind, failure = self._watch(stop)
            except StopRequested:
                return self._stopped(stop.signum)
            finally:
                for fh in self.log_files.values():
                    fh.close()
        if failure is None:
            return Outcome.ended(self._exit_codes())
        ended = sorted(self.results.values(), key=lambda r: r.finished or 0)
        return Outcome(kind, self._exit_codes(), failure=failure,
                       failures=tuple(r.error for r in ended if r.error is not None), lost=self._lost())

    def notice(self) -> bool:
        """GRACE's notice to every rank: SIGTERM, the grace for their checkpoint, SIGKILL (the runner's stop policy).
        The job goes on being watched; it ends preempted when every node ends 0 or 75. True if it found the job."""
        answers = self.runner.stop_all(self.run_id, self.extra_stop)
        return any(res.ok and not res.stdout.startswith("stopped 0") for res in answers.values())

    def _stopped(self, signum: int) -> Outcome:
        """Stopped by a signal: with GRACE a notice first (preempted when every node then ended 0 or 75); the job
        stopped on every node however it ends."""
        name = signal.Signals(signum).name
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {name}"
        grace = self.runner.stop.grace
        if grace is not None:
            self.runner.say(f"{name}: a notice to every rank (SIGTERM; GRACE={grace:g} s to checkpoint, then SIGKILL)")
        else:
            self.runner.say(f"{what}: stopping the job on every node")
        self._gang_stop(name_failures=False)
        codes = self._exit_codes()
        if grace is not None and EXIT_PREEMPTED in codes.values() and \
                all(code in (0, EXIT_PREEMPTED) for code in codes.values()):
            return Outcome.ended(codes, stopped_by=name)
        head = next(iter(self.results))
        return Outcome.interrupted(signum, f"{what}; run {self.run_id} was stopped on every node", head, codes)

    def _exit_codes(self) -> dict[str, int | None]:
        return {name: result.exit_code for name, result in self.results.items()}

    def _lost(self) -> tuple[str, ...]:
        return tuple(name for name, result in self.results.items() if result.lost)

    def start(self, name: str) -> None:
        threading.Thread(target=self._node_job, args=(name,), name=f"mn-job-{name}", daemon=True).start()

    def _node_job(self, name: str) -> None:
        result = self.results[name]
        result.started = time.monotonic()
        result.exit_code, result.error, result.lost, result.finished = None, None, False, None
        sinks = [TextSink(LineSink(name, self.runner.print_lock, self.log_files[name], self.runner.out, result.tail,
                                   self.relabel, self.observe)) for _ in range(2)]
        command = f"export {channel.RUN_ID_ENV}={shlex.quote(self.run_id)} && {self.command_lines[name]}"
        try:
            result.exit_code, _, _ = self.runner.execute(name, command, timeout=None, out=sinks[0], err=sinks[1])
        except Exception as err:  # lost SSH session: the node is gone or unreachable
            result.lost = True
            result.error = result.error or self._node_error(name, f"lost its SSH session ({describe_ssh_error(err)})")
        finally:
            for sink in sinks:
                sink.close()
            result.finished = time.monotonic()
            self.events.put(name)

    def _watch(self, stop: StopSignals) -> tuple[str, NodeError | None]:
        """Until every node ended: (the outcome's kind, the first failure: a node's, the deadline's or a stall's),
        or ("", None) when none failed."""
        pending = set(self.results)
        head = next(iter(self.results))
        end = None if self.deadline is None else time.monotonic() + self.deadline
        asked = time.monotonic()
        while pending:
            if stop.signum is not None:
                raise StopRequested
            try:
                name = self.events.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() - asked >= GONE_POLL:
                    asked, gone = time.monotonic(), self._gone(pending)
                    if gone is not None:
                        pending.discard(gone.node)
                        return "lost", self._fail(gone, f"{gone.node} failed ({gone.message})", pending)
                if end is not None and time.monotonic() > end:
                    why = f"deadline of {self.deadline:.0f} s passed"
                    return "failed", self._fail(NodeError(head, "job", None, f"{why}; the job was stopped"), why, pending)
                why = self.stalled() if self.stalled is not None else None
                if why is not None:
                    return "stalled", self._fail(NodeError(head, "job", None, f"{why}; the job was stopped"), why,
                                                 pending)
                continue
            result = self.results[name]
            if result.finished is None:
                continue  # a relaunch started it again before this event was read
            # EXIT_PREEMPTED: the node's ranks stopped on a notice, the others stop at the same step: not a failure.
            if result.error is None and result.exit_code not in (0, None, EXIT_PREEMPTED):
                result.error = self._node_error(name, f"exited with code {result.exit_code}")
            if result.error is not None and self._may_rejoin(name, result, self.rejoin):
                result.relaunches += 1
                self.runner.say(f"{name} {result.error.message}: starting it again when it answers "
                                f"(relaunch {result.relaunches}/{self.rejoin.budget})")
                threading.Thread(target=self._relaunch, args=(name,), name=f"mn-rejoin-{name}", daemon=True).start()
                continue
            pending.discard(name)
            if result.error is not None:
                kind = "lost" if result.lost else "failed"
                return kind, self._fail(result.error, f"{name} failed ({result.error.message})", pending)
        return "", None

    def _gone(self, pending: set[str]) -> NodeError | None:
        """The first node of ``pending`` whose machine is gone (the provider's word), made a lost node's failure."""
        for name, why in self.runner.vanished(pending).items():
            result = self.results[name]
            result.lost, result.finished, result.error = True, time.monotonic(), self._node_error(name, f"is gone ({why})")
            self.runner.drop(name)  # its session would wait on a connection no answer will ever come back on
            return result.error
        return None

    def _fail(self, failure: NodeError, why: str, pending: set[str]) -> NodeError:
        """Say why, give the caller its look at the live ranks, stop the job everywhere; the failure."""
        self.runner.say(f"{why}: stopping the job on every node")
        for name in self.runner.vanished(list(self.results)):  # a machine gone: lost, neither looked at nor asked
            self.results[name].lost = True
        self.runner.cut_off(self._lost(), [n for n in pending if n not in self._lost()])  # peers' collectives fail now
        if self.before_stop is not None:
            try:
                self.before_stop(failure, self._lost())
            except Exception as err:  # a diagnosis that fails must not leave the job running
                log.warning("before the stop: %s: %s", type(err).__name__, err)
        self._gang_stop(pending)
        return failure

    @staticmethod
    def _may_rejoin(name: str, result: NodeResult, rejoin: Rejoin | None) -> bool:
        return (rejoin is not None and name not in rejoin.exclude and result.killed
                and result.relaunches < rejoin.budget)

    def _relaunch(self, name: str) -> None:
        """Wait for the node to answer SSH, clear what is left of the run on it, prepare it, start it again.
        If it does not come back within ``rejoin.wait``, its failure stands and ends the job."""
        result, rejoin, runner = self.results[name], self.rejoin, self.runner
        runner.drop(name)
        why = runner.connect_until([name], time.monotonic() + rejoin.wait).get(name)
        if why is None:
            try:
                runner.stop_all(self.run_id, self.extra_stop, names=[name])
                rejoin.prepare(name)
            except Exception as err:  # the node answered but cannot be prepared: its failure stands
                why = f"could not be prepared again: {err}"
        if why is not None:
            result.error = self._node_error(name, f"did not come back within {rejoin.wait:.0f} s ({why})")
            result.relaunches = rejoin.budget  # no further attempt
            self.events.put(name)
            return
        runner.say(f"{name} answers again: relaunching its part of run {self.run_id}")
        self.start(name)

    def _gang_stop(self, pending: set[str] | None = None, name_failures: bool = True) -> None:
        """Stop the run everywhere, then give the remaining sessions a bounded time to end.

        A node that does not even answer the stop command is unreachable (crashed, or cut off): its
        session is dropped at once and (``name_failures``) it is reported as lost, which makes it the likely
        root cause.
        """
        pending = set(pending if pending is not None else (n for n, r in self.results.items() if r.finished is None))
        answers = self.runner.stop_all(self.run_id, self.extra_stop)  # up to the runner's stop grace
        end = time.monotonic() + LOST_GRACE
        unreachable = {name for name in pending if answers[name].exit_code is None}
        while pending - unreachable and time.monotonic() < end:
            try:
                pending.discard(self.events.get(timeout=0.2))
            except queue.Empty:
                continue
        for name in pending:
            result = self.results[name]
            why = f"did not end within {LOST_GRACE:.0f} s of the stop"
            if name in unreachable:
                gone = self.runner.gone.get(name)
                why = f"is gone ({gone})" if gone else "stopped answering (unreachable: no answer to the stop)"
            log.warning("%s: %s; dropping its connection", name, why)
            result.lost = result.lost or name in unreachable
            if result.error is None and name_failures:
                result.error = self._node_error(name, why)
                result.finished = time.monotonic()
            self.runner.drop(name)

    def _node_error(self, name: str, message: str) -> NodeError:
        return NodeError(name, "job", self.results[name].exit_code, message, tail=list(self.results[name].tail),
                         log_path=str(self.log_dir / f"{name}.log"))
