"""The SLURM backend: the cluster's own scheduler runs the job as one batch job.

The plan is an sbatch script (:mod:`multinode.backends.slurm.script`, pure; ``--dry-run`` prints it), submitted
and followed on the login node (:mod:`multinode.backends.slurm.follow`). Everything around it is the run's, as
over SSH: pre-flight with the software skew check, the one incremental sync, SETUP, ENV files, NPROC=auto, the
stall watchdog, the stacks of the live ranks, the root cause and the summary.

What cannot apply here, said in one line by the run or refused before anything starts:

* MAX_RESTARTS / ELASTIC: the scheduler owns the allocation (requeue with ``sbatch --requeue`` instead);
* a cluster described by its login node only (``PROVIDER=hosts``, a shared filesystem): the run reaches no
  other node, so the skew check, the stall watchdog and the stack capture are not run (the scheduler's own
  ``--kill-on-bad-exit`` still ends a failed job, and the failing task is named from its output).
"""

from __future__ import annotations

import signal
from dataclasses import replace

from multinode.backends.base import JobEnd
from multinode.backends.slurm import follow
from multinode.backends.slurm.script import SlurmJob, pick_mpi_plugin, plan_sbatch
from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED, Interrupted, JobFailed, NodeError, UserError
from multinode.core.inventory import Inventory
from multinode.plan.launchers import EntryPoint
from multinode.plan.launchers.base import nproc_of
from multinode.plan.launchers.torchrun import root_cause_rank


def preempted(outcome: follow.SlurmOutcome) -> bool:
    """The ranks stopped on a notice: a task reported 75 and none reported anything else (a preempted task exits 0
    for SLURM's sake, multinode.backends.slurm.grace), whatever state the scheduler gives the job (a notice by
    ``scancel`` or a preemption may leave it CANCELLED or PREEMPTED)."""
    codes = [code for _, code, _ in outcome.failed_nodes]
    return not outcome.stalled and EXIT_PREEMPTED in codes and all(code == EXIT_PREEMPTED for code in codes)


class SlurmBackend:
    name = "slurm"
    unchecked = ("the cluster is described by its login node: the software skew check, the stall watchdog and "
                 "the stack capture need SSH to every node of the job and are not run")

    def __init__(self, inventory: Inventory, spec: LaunchSpec):
        if spec.max_restarts or spec.elastic:
            raise UserError("MAX_RESTARTS/ELASTIC are not planned for SLURM clusters; requeue with sbatch --requeue "
                            "instead, or leave them unset")
        self.spec = spec
        self.shared = bool(inventory.extra.get("shared_fs"))  # described by its login node: the scheduler has the nodes
        self.reaches_every_node = not self.shared
        self.partition = inventory.extra.get("slurm_partition")
        self.recorded_plugin = inventory.extra.get("slurm_mpi")  # the PMI plugin `up` recorded (dry run: no I/O)

    def nodes(self, inventory: Inventory) -> Inventory:
        return inventory if self.shared else inventory.first(self.spec.nodes)

    def _spec(self, inv: Inventory) -> LaunchSpec:
        """NPROC=auto resolved: one task count for every node (the scheduler asks one --ntasks-per-node)."""
        if self.spec.nproc != "auto":
            return self.spec
        counts = {nproc_of(self.spec, node) for node in inv.nodes}
        if len(counts) > 1:
            raise UserError(f"NPROC=auto gives different process counts per node ({sorted(counts)}) and SLURM asks one "
                            f"--ntasks-per-node; give NPROC a number")
        return replace(self.spec, nproc=counts.pop())

    def plan(self, run, entry: EntryPoint) -> SlurmJob:
        return plan_sbatch(run.inv, self._spec(run.inv), entry, self.recorded_plugin, self.partition)

    def describe(self, run, job: SlurmJob) -> str:
        return job.script.rstrip("\n")

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        return False  # srun (or mpirun inside the allocation) starts the ranks, not SSH

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        return None if self.shared else spec.rdzv_port  # MPI ranks get it as MASTER_PORT

    def finish_plan(self, run, job: SlurmJob) -> SlurmJob:
        """The PMI plugin the cluster's srun offers now (``srun --mpi=list``; none: mpirun in the allocation)."""
        if not run.spec.uses_mpi:
            return job
        plugin = pick_mpi_plugin(follow.detect_mpi(run.runner))
        return plan_sbatch(run.inv, self._spec(run.inv), run.code.entry, plugin, self.partition)

    def record(self, run, job: SlurmJob) -> None:
        (run.run_dir / "job.sbatch").write_text(job.script)
        how = job.launch
        print(f"run {run.spec.run_id}: MODE={run.spec.mode} on {run.spec.nodes} node(s) x {job.world_size // job.nodes} "
              f"process(es) through SLURM ({how}), logs in {run.run_dir}", file=run.out)

    def write_files(self, run, job: SlurmJob, names: list[str] | None = None) -> None:
        pass  # the batch script carries everything; it is written on the login node at submission

    def run(self, run, job: SlurmJob, watchdog) -> JobEnd:
        outcome = follow.run(run.runner, job, run.out, run.run_dir, stalled=watchdog.stalled if watchdog else None,
                             before_stop=run.capture, grace=run.spec.grace)
        print(f"batch job {outcome.job_id}: {outcome.state}, exit code {outcome.exit_code}", file=run.out)
        failed = {node: code for node, code, _ in outcome.failed_nodes}
        exit_codes = {f"node-{i}": failed.get(f"node-{i}", 0 if outcome.exit_code == 0 else None)
                      for i in range(run.spec.nodes)}
        if (outcome.state == "COMPLETED" and outcome.exit_code == 0) or preempted(outcome):
            return JobEnd(exit_codes, lines=outcome.lines, stopped_by=outcome.stopped_by)
        if outcome.stopped_by:  # GRACE: the notice did not end in a checkpoint; stopped, as without GRACE
            stopped = Interrupted(f"{outcome.stopped_by}: batch job {outcome.job_id} ended {outcome.state} after the "
                                  f"notice; run {run.spec.run_id} was stopped on every node")
            stopped.exit_code = 128 + signal.Signals[outcome.stopped_by].value
            raise stopped
        head = run.inv.head.name
        errors = [NodeError(node, "srun task", code, f"exited with code {code} (batch job {outcome.job_id}, "
                                                     f"{outcome.state})",
                            tail=outcome.node_lines(node)[-20:], log_path=str(run.run_dir / f"{node}.log"))
                  for node, code, _ in outcome.failed_nodes]
        if outcome.stalled:
            first = NodeError(head, "job", None, f"{outcome.stalled}; batch job {outcome.job_id} was cancelled")
        elif errors:
            first = errors[0]
        else:
            first = NodeError(head, "sbatch", outcome.exit_code, f"batch job {outcome.job_id} ended {outcome.state}",
                              tail=outcome.lines[-20:])
        raise JobFailed(first, failures=errors or [first], exit_codes=exit_codes)

    def failed_rank(self, run, job: SlurmJob, node: str, lines: list[str]) -> int | None:
        """The rank the node's task reported with its exit (srun --mpi), else torchrun's own report."""
        ranks = [int(exited[3]) for exited in map(follow.NODE_EXITED.match, lines)
                 if exited and exited[1] == node and exited[3]]
        if ranks:
            return ranks[-1]
        if run.spec.uses_mpi:
            return None
        prefix = f"[{node}] "
        return root_cause_rank([line[len(prefix):] if line.startswith(prefix) else line for line in lines])
