"""The SLURM path's executor: submit the planned sbatch script on the login (head) node and follow it.

Contract, in order:

1. write the script (:mod:`multinode.backends.slurm.script`) into the run's directory on the login node and
   ``sbatch --parsable`` it; print ``submitted batch job <id>``;
2. follow it: every half second one SSH command reads the job's state (``scontrol show job -o``) and
   the new bytes of its output file; whole lines go to the console as they are (every task prefixed
   them ``[node-i] [rankN]``) and into ``<run dir>/<node>.log`` per node;
3. the exit code is the scheduler's (``ExitCode`` of ``scontrol show job``, which works without
   slurmdbd; ``sacct`` may not exist);
4. Ctrl-C, SIGTERM or SIGHUP, or any error while following: ``scancel`` the job and wait until the
   scheduler says it ended; then, in every case, the run's processes are swept on every node (by the
   ``MULTINODE_RUN_ID`` in their environment), so nothing is left. With GRACE (the runner's stop policy) a stop
   signal is a notice first: :func:`notice`, ``scancel --signal=TERM`` (the signal alone, the job goes on:
   scancel(1)), the job followed for up to GRACE + 2 s more; a job that ended by itself in that time is the
   outcome (``stopped_by`` says why), otherwise it is cancelled as above (``cancelled``). Growing back gives the
   same notice through the backend while the job is followed.

Nothing here decides what runs: that is the planner's job.
"""

from __future__ import annotations

import re
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from multinode.core.errors import NodeError
from multinode.ssh.signals import StopSignals
from multinode.ssh.runner import RemoteRunner
from multinode.backends.slurm.script import TERMINAL_STATES, SlurmJob, held_reason, job_state

POLL = 0.5
CANCEL_WAIT = 60.0
MARK = "----multinode-output----"
NODE_PREFIX = re.compile(r"^\[(node-\d+)\] ")
NODE_EXITED = re.compile(r"^\[(node-\d+)\] multinode: node-\d+ exited with code (\d+)(?: \(rank (\d+)\))?")


@dataclass
class SlurmOutcome:
    job_id: str
    state: str
    exit_code: int
    lines: list[str] = field(default_factory=list)
    failed_nodes: list[tuple[str, int, int | None]] = field(default_factory=list)  # (node, code, rank), as reported
    stalled: str | None = None  # why the stall watchdog ended the job (it was cancelled), or None
    stopped_by: str | None = None  # a stop signal to the orchestrator (with GRACE: passed to the ranks as a notice)
    cancelled: bool = False  # the stop signal cancelled the job (without GRACE, or its notice did not end it)

    def node_lines(self, node: str) -> list[str]:
        """The lines of one node, its ``[node-i] `` prefix removed."""
        prefix = f"[{node}] "
        return [line[len(prefix):] for line in self.lines if line.startswith(prefix)]


def detect_mpi(runner: RemoteRunner) -> str:
    """``srun --mpi=list`` on the login node (empty when it fails)."""
    res = runner.run_on(runner.inventory.head.name, "srun --mpi=list 2>&1", timeout=20)
    return res.stdout if res.ok else ""


def submit(runner: RemoteRunner, job: SlurmJob) -> str:
    head = runner.inventory.head.name
    runner.run_on(head, f"mkdir -p {shlex.quote(job.job_dir)}", timeout=15)
    runner.put_bytes(head, job.script_path, job.script.encode())
    res = runner.run_on(head, f"sbatch --parsable {shlex.quote(job.script_path)}", timeout=30)
    job_id = res.stdout.strip().split(";")[0]
    if not res.ok or not job_id.isdigit():
        raise NodeError(head, "sbatch", res.exit_code, "sbatch refused the job: "
                        + (res.stderr.strip() or res.error or res.stdout.strip()))
    return job_id


class _Follower:
    """Reads the job's state and the new part of its output in one round trip."""

    def __init__(self, runner: RemoteRunner, job: SlurmJob, job_id: str, out: TextIO, log_dir: Path,
                 observe: Callable[[str, str], bool] | None = None):
        self.runner, self.job, self.job_id, self.out, self.log_dir = runner, job, job_id, out, log_dir
        self.observe = observe  # (node, line) -> True: the run read it (step times): the log keeps it, not the console
        self.offset = 0
        self.partial = b""
        self.lines: list[str] = []
        self.failed: list[tuple[str, int, int | None]] = []

    def poll(self) -> tuple[str | None, int | None, str | None]:
        """(state, exit code, reason it is held) of the job; prints the output that arrived since."""
        output = shlex.quote(self.job.output_path(self.job_id))
        command = (f"scontrol show job -o {self.job_id} 2>&1; echo {MARK}; "
                   f"tail -c +{self.offset + 1} {output} 2>/dev/null || true")
        res = self.runner.run_on(self.runner.inventory.head.name, command, timeout=30)
        if res.exit_code is None:
            raise NodeError(self.runner.inventory.head.name, "scontrol show job", None,
                            f"the login node stopped answering: {res.error}")
        status, _, data = res.stdout.partition(MARK + "\n")
        raw = data.encode()
        self.offset += len(raw)
        self._emit(raw)
        line = status.strip().splitlines()[0] if status.strip() else ""
        return (*job_state(line), held_reason(line))

    def _emit(self, raw: bytes) -> None:
        chunk = self.partial + raw
        *whole, self.partial = chunk.split(b"\n")
        for piece in whole:
            self._line(piece.decode(errors="replace"))

    def flush(self) -> None:
        if self.partial:
            self._line(self.partial.decode(errors="replace"))
            self.partial = b""

    def _line(self, line: str) -> None:
        match = NODE_PREFIX.match(line)
        name = match[1] if match else self.runner.inventory.head.name
        with open(self.log_dir / f"{name}.log", "a") as log:
            log.write(line + "\n")
        if self.observe is not None and self.observe(name, line):
            return
        self.lines.append(line)
        print(line, file=self.out, flush=True)
        exited = NODE_EXITED.match(line)
        if exited:
            self.failed.append((exited[1], int(exited[2]), int(exited[3]) if exited[3] else None))


def cancel(runner: RemoteRunner, job_id: str) -> str | None:
    """scancel, then wait until the scheduler reports the job ended; its final state."""
    head = runner.inventory.head.name
    runner.run_on(head, f"scancel {job_id}", timeout=15)
    end = time.monotonic() + CANCEL_WAIT
    state = None
    while time.monotonic() < end:
        res = runner.run_on(head, f"scontrol show job -o {job_id}", timeout=15)
        state, _ = job_state(res.stdout.strip())
        if state in TERMINAL_STATES or (res.ok is False and "Invalid job id" in res.stderr):
            return state
        time.sleep(POLL)
    return state


def notice(runner: RemoteRunner, job_id: str) -> None:
    """SIGTERM to every step of the job, which goes on (``scancel --signal=TERM``; the batch shell is not signalled)."""
    runner.run_on(runner.inventory.head.name, f"scancel --signal=TERM {job_id}", timeout=15)


def follow(runner: RemoteRunner, job: SlurmJob, job_id: str, out: TextIO, log_dir: Path,
           stalled: Callable[[], str | None] | None = None,
           before_stop: Callable[[NodeError, tuple[str, ...]], None] | None = None,
           observe: Callable[[str, str], bool] | None = None) -> SlurmOutcome:
    """Stream the submitted job ``job_id`` until it ends; how it ended. ``stalled``: the stall watchdog's verdict,
    asked every poll; when it names a stall, ``before_stop`` looks at the live ranks, then the job is cancelled and
    the outcome says why. A stop signal cancels it -- with GRACE (the runner's stop policy) after a notice (module
    doc) -- and the outcome names the signal. The job is cancelled however this ends, and the run's processes are
    swept on every node."""
    print(f"submitted batch job {job_id} (run {job.run_id}); output {job.output_path(job_id)}", file=out, flush=True)
    follower = _Follower(runner, job, job_id, out, log_dir, observe)
    grace = runner.stop.grace
    finished = False
    noticed: tuple[str, float] | None = None  # (the signal's name, when the grace is over)
    try:
        with StopSignals() as signals:
            while True:
                state, code, held = follower.poll()
                if held:
                    raise NodeError(runner.inventory.head.name, "sbatch", None,
                                    f"batch job {job_id} cannot start ({held}); see the slurmd logs of its nodes")
                if state in TERMINAL_STATES:
                    finished = True
                    follower.flush()
                    return SlurmOutcome(job_id, state, code if code is not None else 1, follower.lines,
                                        follower.failed, stopped_by=noticed[0] if noticed else None)
                why = stalled() if stalled is not None else None
                if why is not None:
                    runner.say(f"{why}: cancelling batch job {job_id}")
                    if before_stop is not None:
                        before_stop(NodeError(runner.inventory.head.name, "job", None, why), ())
                    final = cancel(runner, job_id)
                    finished = True
                    follower.flush()
                    return SlurmOutcome(job_id, final or "CANCELLED", 1, follower.lines, follower.failed, stalled=why)
                if signals.signum is not None and grace is not None and noticed is None:
                    noticed = (signal.Signals(signals.signum).name, time.monotonic() + grace + 2)
                    runner.say(f"{noticed[0]}: a notice to every rank (scancel --signal=TERM; GRACE={grace:g} s to "
                               f"checkpoint, then scancel)")
                    notice(runner, job_id)
                elif signals.signum is not None and (noticed is None or time.monotonic() > noticed[1]):
                    final = cancel(runner, job_id)
                    finished = True
                    follower.flush()
                    return SlurmOutcome(job_id, final or "CANCELLED", 1, follower.lines, follower.failed,
                                        stopped_by=signal.Signals(signals.signum).name, cancelled=True)
                time.sleep(POLL)
    finally:
        if not finished:
            cancel(runner, job_id)
        runner.stop_all(job.run_id)
