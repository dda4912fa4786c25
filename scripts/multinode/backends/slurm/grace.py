"""GRACE in the batch script (docs/preemption.md): a SIGTERM from SLURM is a notice, and what the ranks print and
return after it still reaches the job's output and the orchestrator. Pure text; :mod:`.script` puts it in place.

What SLURM does, as Slurm 22.05's own pages say it (Debian 12's slurm-client, sbatch(1), scancel(1), slurm.conf(5)):

* ``scancel <job>``: "send first a SIGCONT to all steps to eventually wake them up followed by a SIGTERM, then wait
  the KillWait duration defined in the slurm.conf file and finally if they have not terminated send a SIGKILL";
  ``KillWait`` defaults to 30 s and is the cluster's, not the job's. ``scancel --signal=TERM <job>`` sends the
  signal alone: the job goes on, so the ranks take as long as they need (the orchestrator's own stop uses that and
  waits GRACE, :mod:`.follow`);
* preemption: "Once a job has been selected for preemption, its end time is set to the current time plus
  GraceTime. The job's tasks are immediately sent SIGCONT and SIGTERM signals", SIGKILL at the new end time
  (``GraceTime``: per partition, default 0);
* ``--signal=[{R|B}:]<sig_num>[@sig_time]``: "When a job is within sig_time seconds of its end time, send it the
  signal sig_num. Due to the resolution of event handling by Slurm, the signal may be sent up to 60 seconds earlier
  than specified ... By default all job steps will be signaled, but not the batch shell itself." So
  ``--signal=TERM@GRACE`` gives the ranks a notice GRACE seconds before a time limit (and, with the controller's
  ``preempt_send_user_signal``, at preemption); without a time limit it never fires and costs nothing.

A job cannot lengthen KillWait or GraceTime: a site that preempts or cancels with less than GRACE cuts the
checkpoint short (set ``KillWait``/``GraceTime`` >= GRACE on the cluster).

In every task, as in the static starter (:mod:`multinode.plan.launchers.static`): the task's shell and the ``sed``
that prefixes the lines ignore SIGTERM (an ignored signal stays ignored in the programs they start), the program
itself runs in a group that catches it (a caught signal is the default again in what it starts), so the rank gets
SIGTERM and its own handler (training/preempt.py, training/guard.py) while the pipeline outlives it and the task
still reports its exit code. The guard in front of the ranks, the agent's environment and the exit-75 rule of a
torchrun node are the launchers' (:mod:`multinode.plan.launchers.base`, :mod:`~multinode.plan.launchers.torchrun`);
here is only where they go in the task. A task whose ranks ended preempted (75) exits 0 after saying so: SLURM's
``--kill-on-bad-exit`` would otherwise kill the other nodes' tasks while rank 0 still writes the snapshot; the
orchestrator reads the 75 from the line (:data:`multinode.backends.slurm.follow.NODE_EXITED`).
"""

from __future__ import annotations

import math
import shlex

from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED
from multinode.core.inventory import Inventory
from multinode.plan.launchers.base import CATCH_TERM, IGNORE_TERM, PREEMPT_MARK_ENV, guard_script, preempted_status
from multinode.plan.launchers.words import shell_word


def signal_header(spec: LaunchSpec) -> list[str]:
    """The #SBATCH line that asks for SIGTERM GRACE seconds before the job's end (nothing without GRACE)."""
    return [f"#SBATCH --signal=TERM@{math.ceil(spec.grace)}"] if spec.grace is not None else []


def catching(spec: LaunchSpec, command: str) -> str:
    """``command`` in a group that catches SIGTERM (with GRACE), so the program it starts gets the default."""
    return f"{{ {CATCH_TERM}; {command}; }}" if spec.grace is not None else command


def guard_path(inv: Inventory, spec: LaunchSpec, node: str) -> str:
    """``; guard=<path>`` for the task's per-node setup (nothing without GRACE): the ``$guard`` the launchers' guard
    runs from."""
    return f"; guard={shlex.quote(guard_script(inv, node))}" if spec.grace is not None else ""


def task_lines(spec: LaunchSpec, mark: str | None) -> tuple[list[str], list[str], list[str]]:
    """(first lines of the task, lines before its launch, lines after ``rc``): with GRACE the task ignores SIGTERM;
    where the launcher's guards note a preemption (torchrun: ``mark``, the agent's ``MULTINODE_PREEMPT_MARK``) the
    task clears the note first and its status becomes 75 by the launcher's rule; a preempted task says 75 and
    exits 0."""
    if spec.grace is None:
        return [], [], []
    before = [f"export {PREEMPT_MARK_ENV}={shell_word(mark)}", f'rm -f "${PREEMPT_MARK_ENV}"'] if mark else []
    after = [preempted_status("rc", f"${PREEMPT_MARK_ENV}")] if mark else []
    after.append(f'if [ "$rc" = {EXIT_PREEMPTED} ]; then echo "[$node] multinode: $node exited with code '
                 f'{EXIT_PREEMPTED} (preempted)"; exit 0; fi')
    return [IGNORE_TERM], before, after
