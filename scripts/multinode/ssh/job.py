"""One command on every node at once, each node's part reporting how it ended: the SSH backend's job, and SETUP's.

The runner (:mod:`multinode.ssh.runner`) keeps the connections, shells and short commands; this module owns the
parts of a running job -- the mechanism only. What to do when a part ends, a node is lost, a stall is seen or a
signal comes is the run's (:mod:`multinode.app.watch`); here:

* every node's command runs in one of its shells (:mod:`multinode.ssh.shell`) with the run id exported
  (``MULTINODE_RUN_ID``: the stop and the watchdog find the run's processes by it); its output is re-assembled into
  whole lines (:class:`~multinode.ssh.lines.LineSink`), so lines of different nodes never interleave mid-line; each
  goes to ``<log_dir>/<node>.log`` and, prefixed ``[node-i]``, to the console (but for the lines the caller's
  ``observe`` reads: the job channel's records the run keeps off the console);
* when a node's part ends -- an exit code, or its SSH session died -- one
  :class:`~multinode.core.events.NodeEnded` goes on the attempt's :class:`~multinode.core.events.Events`;
* :meth:`JobRun.stop` stops the run's processes on the nodes (processes whose environment carries the run id:
  torchrun starts workers in their own session, so a process-tree or process-group kill would miss them) under the
  runner's stop policy (GRACE: SIGTERM, the grace, SIGKILL), and says which nodes answered;
* :meth:`JobRun.relaunch` (elastic jobs, MAX_RESTARTS): waits for a node to answer SSH again (rebooted or
  replaced), clears what is left of the run on it, lets the caller prepare it (code sync) and starts its part
  again; a node that does not come back within the wait ends with its error;
* parallelism is plain daemon threads: a node that stops answering never hangs the caller.
"""

from __future__ import annotations

import shlex
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from multinode.core.errors import NodeError
from multinode.core.events import Events, NodeEnded, part_killed
from multinode.core.outcome import Ending, Outcome
from multinode.ssh.connect import describe_ssh_error
from multinode.ssh.lines import LineSink, Relabel
from multinode.ssh.runner import RemoteRunner
from multinode.ssh.shell import TextSink
from multinode.ssh.signals import StopSignals
from multinode.trainer import channel

TAIL_LINES = 20


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
    relaunches: int = 0  # times its part was started again (elastic jobs)

    @property
    def killed(self) -> bool:
        """Lost, or the launcher died by a signal."""
        return part_killed(self.lost, self.exit_code)


class JobRun:
    """``command_lines[node]`` (one shell line per node) on every node of ``runner``, under run id ``run_id``; each
    part's end goes on ``events`` (see the module doc)."""

    def __init__(self, runner: RemoteRunner, command_lines: dict[str, str], *, run_id: str, log_dir: Path,
                 events: Events, extra_stop: Callable[[str], str | None] | None = None,
                 relabel: Relabel | None = None, observe: Callable[[str, str], bool] | None = None):
        self.runner, self.command_lines, self.run_id, self.log_dir = runner, command_lines, run_id, log_dir
        self.events, self.extra_stop, self.relabel, self.observe = events, extra_stop, relabel, observe
        self.results = {name: NodeResult(name) for name in command_lines}
        self.log_files: dict[str, TextIO] = {}
        self.departed: set[str] = set()  # nodes that left while the job went on (a membership change)

    notice_words = "SIGTERM"

    @property
    def nodes(self) -> list[str]:
        return list(self.command_lines)

    @property
    def parts(self) -> list[str]:
        """Every node's part: the run waits for each to end."""
        return self.nodes

    def start(self) -> None:
        """Every node's part started (the log files opened for the job's life: :meth:`close`)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_files = {name: open(self.log_dir / f"{name}.log", "a", encoding="utf-8") for name in self.command_lines}
        for name in self.command_lines:
            self._start_node(name)

    def close(self) -> None:
        for fh in self.log_files.values():
            fh.close()

    def stop(self, names: list[str] | None = None) -> dict[str, bool]:
        """Stop the run's processes on ``names`` (every node) under the runner's stop policy; {node: it answered}."""
        names = self.nodes if names is None else names
        answers = self.runner.stop_all(self.run_id, self.extra_stop, names=names) if names else {}
        return {name: answers[name].exit_code is not None for name in names}

    def notice(self, names: list[str] | None = None) -> bool:
        """GRACE's notice (the stop with the runner's grace: SIGTERM, the grace for a checkpoint, SIGKILL); True if
        it found the job on a node (the stop script says ``stopped 0`` where it found no process)."""
        names = self.nodes if names is None else names
        answers = self.runner.stop_all(self.run_id, self.extra_stop, names=names) if names else {}
        return any(res.ok and not res.stdout.startswith("stopped 0") for res in answers.values())

    def depart(self, name: str) -> None:
        """``name`` left the job while it goes on: its part no longer counts in how the job ends."""
        self.departed.add(name)

    def rejoin(self, name: str) -> None:
        """``name``'s part started again, on its replacement, in the running job."""
        self.departed.discard(name)
        self.results[name].relaunches += 1
        self._start_node(name)

    def drop(self, name: str) -> None:
        """Give up on ``name``'s session: its connection closed (its thread ends when the connection does)."""
        self.runner.drop(name)

    def node_error(self, name: str, message: str) -> NodeError:
        """A failure of ``name``'s part, with its last lines and its log."""
        return NodeError(name, "job", self.results[name].exit_code, message, tail=list(self.results[name].tail),
                         log_path=str(self.log_dir / f"{name}.log"))

    def exit_codes(self) -> dict[str, int | None]:
        return {name: result.exit_code for name, result in self.results.items()}

    def fail_node(self, name: str, message: str, lost: bool) -> NodeError | None:
        """``name``'s part failed for ``message`` (``lost``: its node is gone or unreachable): recorded once, as
        ended now; its failure (the first one recorded)."""
        result = self.results.get(name)
        if result is None:
            return None
        result.lost = result.lost or lost
        if result.error is None:
            result.error = self.node_error(name, message)
            result.finished = time.monotonic()
        return result.error

    def lost(self) -> tuple[str, ...]:
        return tuple(name for name, result in self.results.items() if result.lost)

    def outcome(self, ending: Ending) -> Outcome:
        """The job's outcome: the loop's ending with every node's exit code; a failure's list in the order the
        nodes ended."""
        codes = {name: code for name, code in self.exit_codes().items() if name not in self.departed}
        head = self.nodes[0]
        if ending.stopped_by is not None:
            name = signal.Signals(ending.stopped_by).name
            what = "interrupted" if ending.stopped_by == signal.SIGINT else f"stopped by {name}"
            return Outcome.after_signal(ending.stopped_by, ending.noticed,
                                        f"{what}; run {self.run_id} was stopped on every node", head, codes)
        if ending.failure is None:
            return Outcome.ended(codes)
        ended = sorted((r for r in self.results.values() if r.node not in self.departed), key=lambda r: r.finished or 0)
        lost = tuple(sorted(set(self.lost()) | set(ending.lost), key=self.nodes.index))
        why = {name: (self.results[name].error.message if self.results[name].error else "no SSH") for name in lost}
        return Outcome(ending.kind, codes, failure=ending.failure,
                       failures=tuple(r.error for r in ended if r.error is not None), lost=lost, why_lost=why)

    def _start_node(self, name: str) -> None:
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
            result.error = result.error or self.node_error(name, f"lost its SSH session ({describe_ssh_error(err)})")
        finally:
            for sink in sinks:
                sink.close()
            result.finished = time.monotonic()
            self.events.put(NodeEnded(name, result.exit_code, result.lost, result.error))

    def relaunch(self, name: str, wait: float, prepare: Callable[[str], None]) -> None:
        """Start ``name``'s part again once it answers SSH (within ``wait`` seconds), on a thread; a node that does
        not come back, or cannot be prepared, ends with that error (one :class:`NodeEnded` with it)."""
        self.results[name].relaunches += 1
        threading.Thread(target=self._relaunch, args=(name, wait, prepare), name=f"mn-rejoin-{name}",
                         daemon=True).start()

    def _relaunch(self, name: str, wait: float, prepare: Callable[[str], None]) -> None:
        result, runner = self.results[name], self.runner
        runner.drop(name)
        why = runner.connect_until([name], time.monotonic() + wait).get(name)
        if why is None:
            try:
                runner.stop_all(self.run_id, self.extra_stop, names=[name])
                prepare(name)
            except Exception as err:  # the node answered but cannot be prepared: its failure stands
                why = f"could not be prepared again: {err}"
        if why is not None:
            result.error = self.node_error(name, f"did not come back within {wait:.0f} s ({why})")
            self.events.put(NodeEnded(name, result.exit_code, result.lost, result.error, final=True))
            return
        runner.say(f"{name} answers again: relaunching its part of run {self.run_id}")
        self._start_node(name)


LOST_GRACE = 15.0  # after a stop, how long a node's session may take to end before it is dropped


def until_ended(job: JobRun, deadline: float | None = None) -> Outcome:
    """A job with nothing to recover (SETUP): started, then watched until every part ended; the first part that
    fails, the deadline or a stop signal stops the others. A job of the run's attempts is watched by the run
    (:mod:`multinode.app.watch`), which decides more: capture, cut-off, notices, rejoin, growing back."""
    head = job.nodes[0]
    end = None if deadline is None else time.monotonic() + deadline
    pending = set(job.nodes)
    failure: NodeError | None = None
    with StopSignals() as stop:
        job.start()
        try:
            while pending and failure is None and stop.signum is None:
                event = job.events.take(0.2)
                if isinstance(event, NodeEnded):
                    pending.discard(event.node)
                    failure = event.error or (job.node_error(event.node, f"exited with code {event.exit_code}")
                                              if event.exit_code != 0 else None)
                elif end is not None and time.monotonic() > end:
                    failure = NodeError(head, "job", None, f"deadline of {deadline:.0f} s passed; the job was stopped")
            if pending:
                job.stop(sorted(pending))
                ends = time.monotonic() + LOST_GRACE
                while pending and time.monotonic() < ends:
                    event = job.events.take(0.2)
                    if isinstance(event, NodeEnded):
                        pending.discard(event.node)
                for name in pending:
                    job.drop(name)
        finally:
            job.close()
    codes = job.exit_codes()
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        what = "interrupted" if stop.signum == signal.SIGINT else f"stopped by {name}"
        return Outcome.interrupted(stop.signum, f"{what}; run {job.run_id} was stopped on every node", head, codes)
    if failure is None:
        return Outcome.ended(codes)
    lost = tuple(name for name, result in job.results.items() if result.lost)
    return Outcome("lost" if failure.node in lost else "failed", codes, failure=failure, failures=(failure,), lost=lost)
