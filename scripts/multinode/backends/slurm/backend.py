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

from multinode.backends.base import RunContext
from multinode.backends.reach import EveryNode, LoginNodeOnly
from multinode.backends.slurm import follow
from multinode.backends.slurm.script import SlurmJob, pick_mpi_plugin, plan_sbatch
from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED, NodeError, UserError
from multinode.core.inventory import Inventory
from multinode.core.outcome import Outcome
from multinode.plan.launchers import EntryPoint
from multinode.plan.launchers.base import nproc_of
from multinode.plan.launchers.torchrun import root_cause_rank

UNCHECKED = ("the cluster is described by its login node: the software skew check, the stall watchdog and the stack "
             "capture need SSH to every node of the job and are not run")


def preempted(outcome: follow.SlurmOutcome) -> bool:
    """The ranks stopped on a notice: a task reported 75 and none reported anything else (a preempted task exits 0
    for SLURM's sake, multinode.backends.slurm.grace), whatever state the scheduler gives the job (a notice by
    ``scancel`` or a preemption may leave it CANCELLED or PREEMPTED)."""
    codes = [code for _, code, _ in outcome.failed_nodes]
    return not outcome.stalled and EXIT_PREEMPTED in codes and all(code == EXIT_PREEMPTED for code in codes)


class SlurmBackend:
    name = "slurm"

    def __init__(self, inventory: Inventory, spec: LaunchSpec):
        if spec.max_restarts or spec.elastic:
            raise UserError("MAX_RESTARTS/ELASTIC are not planned for SLURM clusters; requeue with sbatch --requeue "
                            "instead, or leave them unset")
        self.spec = spec
        self.shared = bool(inventory.extra.get("shared_fs"))  # described by its login node: the scheduler has the nodes
        self.reach = LoginNodeOnly(UNCHECKED) if self.shared else EveryNode()
        self.partition = inventory.extra.get("slurm_partition")
        self.recorded_plugin = inventory.extra.get("slurm_mpi")  # the PMI plugin `up` recorded (dry run: no I/O)
        self.job_id: str | None = None  # the batch job while it runs (its notice)

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

    def plan(self, ctx: RunContext, entry: EntryPoint) -> SlurmJob:
        return plan_sbatch(ctx.inv, self._spec(ctx.inv), entry, self.recorded_plugin, self.partition)

    def describe(self, ctx: RunContext, job: SlurmJob) -> str:
        return job.script.rstrip("\n")

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        return False  # srun (or mpirun inside the allocation) starts the ranks, not SSH

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        return None if self.shared else spec.rdzv_port  # MPI ranks get it as MASTER_PORT

    def finish_plan(self, ctx: RunContext, job: SlurmJob) -> SlurmJob:
        """The PMI plugin the cluster's srun offers now (``srun --mpi=list``; none: mpirun in the allocation)."""
        if not ctx.spec.uses_mpi:
            return job
        plugin = pick_mpi_plugin(follow.detect_mpi(ctx.runner))
        return plan_sbatch(ctx.inv, self._spec(ctx.inv), ctx.code.entry, plugin, self.partition)

    def record(self, ctx: RunContext, job: SlurmJob) -> None:
        (ctx.run_dir / "job.sbatch").write_text(job.script)
        print(f"run {ctx.spec.run_id}: MODE={ctx.spec.mode} on {ctx.spec.nodes} node(s) x "
              f"{job.world_size // job.nodes} process(es) through SLURM ({job.launch}), logs in {ctx.run_dir}",
              file=ctx.out)

    def write_files(self, ctx: RunContext, job: SlurmJob, names: list[str] | None = None) -> None:
        pass  # the batch script carries everything; it is written on the login node at submission

    def run(self, ctx: RunContext, job: SlurmJob) -> Outcome:
        """Submit, follow, and read how the batch job ended (a login node that stops answering, or a job the
        scheduler holds, is a failure of the head's)."""
        head = ctx.inv.head.name
        try:
            self.job_id = follow.submit(ctx.runner, job)
            ended = follow.follow(ctx.runner, job, self.job_id, ctx.out, ctx.run_dir,
                                  stalled=ctx.watchdog.stalled if ctx.watchdog else None, before_stop=ctx.before_stop,
                                  observe=ctx.observe)
        except NodeError as err:
            return Outcome("failed", {n.name: None for n in ctx.inv.nodes}, failure=err, failures=(err,))
        finally:
            self.job_id = None
        print(f"batch job {ended.job_id}: {ended.state}, exit code {ended.exit_code}", file=ctx.out)
        return self._outcome(ctx, ended)

    def _outcome(self, ctx: RunContext, ended: follow.SlurmOutcome) -> Outcome:
        head, lines = ctx.inv.head.name, tuple(ended.lines)
        failed = {node: code for node, code, _ in ended.failed_nodes}
        exit_codes = {f"node-{i}": failed.get(f"node-{i}", 0 if ended.exit_code == 0 else None)
                      for i in range(ctx.spec.nodes)}
        if (ended.state == "COMPLETED" and ended.exit_code == 0 and not ended.cancelled) or preempted(ended):
            return Outcome.ended(exit_codes, stopped_by=ended.stopped_by, lines=lines)
        if ended.stopped_by:  # stopped by a signal (with GRACE: the notice did not end in a checkpoint)
            how = f"cancelled with scancel (state {ended.state})" if ended.cancelled else \
                f"ended {ended.state} after the notice"
            return Outcome.interrupted(signal.Signals[ended.stopped_by].value,
                                       f"{ended.stopped_by}: batch job {ended.job_id} {how}; run {ctx.spec.run_id} "
                                       f"was stopped on every node", head, exit_codes, lines)
        errors = tuple(NodeError(node, "srun task", code, f"exited with code {code} (batch job {ended.job_id}, "
                                                          f"{ended.state})",
                                 tail=ended.node_lines(node)[-20:], log_path=str(ctx.run_dir / f"{node}.log"))
                       for node, code, _ in ended.failed_nodes)
        if ended.stalled:
            stall = NodeError(head, "job", None, f"{ended.stalled}; batch job {ended.job_id} was cancelled")
            return Outcome("stalled", exit_codes, failure=stall, failures=errors or (stall,), lines=lines)
        first = errors[0] if errors else NodeError(head, "sbatch", ended.exit_code,
                                                   f"batch job {ended.job_id} ended {ended.state}",
                                                   tail=list(ended.lines[-20:]))
        return Outcome("failed", exit_codes, failure=first, failures=errors or (first,), lines=lines)

    def notice(self, ctx: RunContext) -> bool:
        job_id = self.job_id
        if job_id is None:
            return False
        follow.notice(ctx.runner, job_id)
        return True

    def failed_rank(self, ctx: RunContext, job: SlurmJob, node: str, lines: list[str]) -> int | None:
        """The rank the node's task reported with its exit (srun --mpi), else torchrun's own report."""
        ranks = [int(exited[3]) for exited in map(follow.NODE_EXITED.match, lines)
                 if exited and exited[1] == node and exited[3]]
        if ranks:
            return ranks[-1]
        if ctx.spec.uses_mpi:
            return None
        prefix = f"[{node}] "
        return root_cause_rank([line[len(prefix):] if line.startswith(prefix) else line for line in lines])
