"""The SLURM path's mechanism: submit the planned sbatch script on the login (head) node, follow it, signal it,
cancel it. What to do when -- a stall, a stop signal, a notice -- is the run's attempt loop's
(:mod:`multinode.app.watch`), through the job's handle (:mod:`multinode.backends.slurm.job`).

1. :func:`submit` writes the script (:mod:`multinode.backends.slurm.script`) into the run's directory on the login
   node and ``sbatch --parsable`` it;
2. :class:`Follower` reads, in one SSH command, the job's state (``scontrol show job -o``) and the new bytes of its
   output file; whole lines go to the console as they are (every task prefixed them ``[node-i] [rankN]``) and into
   ``<run dir>/<node>.log`` per node; the exit code is the scheduler's (``ExitCode`` of ``scontrol show job``, which
   works without slurmdbd; ``sacct`` may not exist);
3. :func:`notice`: ``scancel --signal=TERM`` (the signal alone, the job goes on: scancel(1)); :func:`cancel`:
   ``scancel``, then wait until the scheduler says the job ended.

Nothing here decides what runs: that is the planner's job.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from multinode.core.errors import NodeError
from multinode.ssh.runner import RemoteRunner
from multinode.backends.slurm.script import TERMINAL_STATES, SlurmJob, held_reason, job_state

POLL = 0.5
CANCEL_WAIT = 60.0
MARK = "----multinode-output----"
NODE_PREFIX = re.compile(r"^\[(node-\d+)\] ")
NODE_EXITED = re.compile(r"^\[(node-\d+)\] multinode: node-\d+ exited with code (\d+)(?: \(rank (\d+)\))?")


@dataclass
class SlurmEnded:
    """The batch job as the scheduler ended it: its final state and exit code, its lines, the tasks that reported
    a non-zero exit."""

    job_id: str
    state: str
    exit_code: int
    lines: list[str] = field(default_factory=list)
    failed_nodes: list[tuple[str, int, int | None]] = field(default_factory=list)  # (node, code, rank), as reported


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


class Follower:
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

    def node_lines(self, node: str) -> list[str]:
        """The lines of one node, its ``[node-i] `` prefix removed."""
        prefix = f"[{node}] "
        return [line[len(prefix):] for line in self.lines if line.startswith(prefix)]

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
