"""A submitted batch job, as the run's attempt loop drives it (:class:`~multinode.backends.base.JobHandle`).

A thread follows the job every :data:`~multinode.backends.slurm.follow.POLL` s (:class:`Follower`: its state and
its new output in one SSH command) and reports on the attempt's events: the job ended
(:class:`~multinode.core.events.JobEnded`, with the scheduler's :class:`SlurmEnded`), or it cannot go on
(:class:`~multinode.core.events.JobError`: the scheduler holds it, or the login node stopped answering). The loop
stops it by :func:`cancel` (``scancel``, then the scheduler's word that it ended) and gives it the notice by
:func:`notice` (``scancel --signal=TERM``: the ranks take one coordinated checkpoint, the job goes on). However it
ends, :meth:`SlurmJobRun.close` cancels what is left and sweeps the run's processes on every node (by the
``MULTINODE_RUN_ID`` in their environment), so nothing is left.

The outcome (:meth:`SlurmJobRun.outcome`) is the batch job's, mapped once: every node's exit code from what its
task reported (a preempted task reports 75 and exits 0 for SLURM's sake: :mod:`multinode.backends.slurm.grace`), then
:class:`~multinode.core.outcome.Outcome`'s rule every backend shares: preempted where a 75 is among them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from multinode.backends.slurm.follow import POLL, Follower, SlurmEnded, cancel, notice
from multinode.backends.slurm.script import TERMINAL_STATES, SlurmJob
from multinode.core.errors import EXIT_PREEMPTED, NodeError
from multinode.core.events import Events, JobEnded, JobError
from multinode.core.outcome import Ending, Outcome
from multinode.diagnose.rank import RANK_EXIT
from multinode.ssh.runner import RemoteRunner


class SlurmJobRun:
    """Batch job ``job_id`` of ``job``, followed on a thread (see the module doc)."""

    notice_words = "scancel --signal=TERM"

    def __init__(self, runner: RemoteRunner, job: SlurmJob, job_id: str, nodes: list[str], out: TextIO, log_dir: Path,
                 events: Events, observe: Callable[[str, str], bool] | None = None) -> None:
        self.runner, self.job, self.job_id, self.nodes, self.out = runner, job, job_id, nodes, out
        self.events = events
        self.follower = Follower(runner, job, job_id, out, log_dir, observe)
        self.ended: SlurmEnded | None = None
        self.failures: dict[str, NodeError] = {}  # nodes the run found failed or lost (the scheduler does not say)
        self.lost_nodes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"mn-slurm-{job_id}", daemon=True)

    @property
    def parts(self) -> list[str]:
        """The batch job is one part, the head's (the login node runs it)."""
        return [self.runner.inventory.head.name]

    def start(self) -> "SlurmJobRun":
        print(f"submitted batch job {self.job_id} (run {self.job.run_id}); output {self.job.output_path(self.job_id)}",
              file=self.out, flush=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        head = self.runner.inventory.head.name
        while not self._stop.is_set():
            try:
                state, code, held = self.follower.poll()
            except NodeError as err:
                self.events.put(JobError(err))
                return
            if held:
                self.events.put(JobError(NodeError(head, "sbatch", None, f"batch job {self.job_id} cannot start "
                                                   f"({held}); see the slurmd logs of its nodes")))
                return
            if state in TERMINAL_STATES:
                self.follower.flush()
                self.ended = SlurmEnded(self.job_id, state, code if code is not None else 1, self.follower.lines,
                                        self.follower.failed)
                self.events.put(JobEnded(self.ended))
                return
            self._stop.wait(POLL)

    def stop(self, names: list[str] | None = None) -> dict[str, bool]:
        """Cancel the batch job and wait for the scheduler to end it (the follower then reports it ended)."""
        final = cancel(self.runner, self.job_id)
        return {part: final is not None for part in self.parts}

    def notice(self, names: list[str] | None = None) -> bool:
        """The batch job's notice, to every node (a batch job is signalled whole: ``names`` is not asked for --
        a membership change, the only caller that names nodes, is never a SLURM job's)."""
        notice(self.runner, self.job_id)
        return True

    def drop(self, name: str) -> None:
        self._stop.set()

    def fail_node(self, name: str, message: str, lost: bool) -> NodeError | None:
        if name not in self.nodes:
            return None
        if lost and name not in self.lost_nodes:
            self.lost_nodes.append(name)
        return self.failures.setdefault(name, NodeError(name, "job", None, message))

    def lost(self) -> tuple[str, ...]:
        return tuple(self.lost_nodes)

    def relaunch(self, name: str, wait: float, prepare) -> None:
        raise NotImplementedError("SLURM jobs are not elastic (MAX_RESTARTS is refused for them)")

    def close(self) -> None:
        """Stop following; cancel the job if it did not end; sweep the run's processes on every node."""
        self._stop.set()
        if self.ended is None:
            cancel(self.runner, self.job_id)
        self.runner.stop_all(self.job.run_id)
        self._thread.join(timeout=POLL * 4)

    def _unsaid(self, failed: dict[str, int], state: str) -> tuple[NodeError, ...]:
        """The nodes whose task never said how it ended -- ``--kill-on-bad-exit`` ended it once another task failed
        -- though its launcher had reported a rank of it ended (:data:`~multinode.diagnose.rank.RANK_EXIT`): the
        rank killed first may be one of them, its report later than its peers' (their collective failed at once)."""
        unsaid = []
        for node in (n for n in self.nodes if n not in failed):
            lines = self.follower.node_lines(node)
            code = next((m[1] for line in lines if (m := RANK_EXIT.search(line))), None)
            if code is not None:
                unsaid.append(NodeError(node, "srun task", None, f"a rank of it ended with code {code}, then SLURM "
                                        f"ended its task when another failed (batch job {self.job_id}, {state})",
                                        tail=lines[-20:], log_path=str(self.follower.log_dir / f"{node}.log")))
        return tuple(unsaid)

    # --- the outcome -----------------------------------------------------------------------------------------------

    def outcome(self, ending: Ending) -> Outcome:
        """The batch job's outcome (module doc): every node's code from what its task reported (else 0 when the job
        ended 0, None when it did not); it ended by itself when it COMPLETED with 0 (not cancelled), or when every
        task that reported said 75 -- the ranks stopped on a notice, whatever state the scheduler gives the job
        (a notice by ``scancel`` or a preemption may leave it CANCELLED or PREEMPTED)."""
        ended, head, lines = self.ended, self.parts[0], tuple(self.follower.lines)
        state, code = (ended.state, ended.exit_code) if ended else ("CANCELLED", 1)
        reported = ended.failed_nodes if ended else self.follower.failed
        failed = {node: rc for node, rc, _ in reported}
        codes = {node: failed.get(node, 0 if code == 0 else None) for node in self.nodes}
        if ended is not None:
            print(f"batch job {self.job_id}: {state}, exit code {code}", file=self.out)
        preempted = bool(failed) and all(rc == EXIT_PREEMPTED for rc in failed.values())
        by_itself = ending.failure is None and (
            (state == "COMPLETED" and code == 0 and not ending.cancelled) or preempted)
        if by_itself:
            name = signal.Signals(ending.stopped_by).name if ending.stopped_by is not None else None
            return Outcome.ended(codes, stopped_by=name, lines=lines)
        if ending.stopped_by is not None:
            name = signal.Signals(ending.stopped_by).name
            how = f"cancelled with scancel (state {state})" if ending.cancelled else f"ended {state} after the notice"
            return Outcome.interrupted(ending.stopped_by, f"{name}: batch job {self.job_id} {how}; run "
                                                          f"{self.job.run_id} was stopped on every node", head, codes,
                                       lines)
        errors = tuple(NodeError(node, "srun task", rc, f"exited with code {rc} (batch job {self.job_id}, {state})",
                                 tail=self.follower.node_lines(node)[-20:],
                                 log_path=str(self.follower.log_dir / f"{node}.log")) for node, rc, _ in reported)
        if ending.kind == "stalled":
            why = ending.failure.message.removesuffix("; the job was stopped")
            stall = NodeError(head, "job", None, f"{why}; batch job {self.job_id} was cancelled")
            return Outcome("stalled", codes, failure=stall, failures=errors or (stall,), lines=lines)
        errors += self._unsaid(failed, state)  # a failure's, not a stall's (the stacks name that one)
        if ending.failure is not None:
            why = {node: self.failures[node].message for node in self.lost_nodes}
            return Outcome(ending.kind, codes, failure=ending.failure, failures=(ending.failure, *errors),
                           lost=tuple(self.lost_nodes), why_lost=why, lines=lines)
        first = errors[0] if errors else NodeError(head, "sbatch", code, f"batch job {self.job_id} ended {state}",
                                                   tail=list(self.follower.lines[-20:]))
        return Outcome("failed", codes, failure=first, failures=errors or (first,), lines=lines)
