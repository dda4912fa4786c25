"""The SLURM backend: the cluster's own scheduler runs the job as one batch job.

The plan is an sbatch script (:mod:`multinode.backends.slurm.script`, pure; ``--dry-run`` prints it), submitted
and followed on the login node (:mod:`multinode.backends.slurm.job`, the run's handle on it). Everything around it
is the run's, as over SSH: pre-flight with the software skew check, the one incremental sync, SETUP, ENV files,
NPROC=auto, and the attempt loop's decisions -- the stall watchdog, a node the provider says is gone (the batch job
cancelled, the lost node's connections cut on the others), the stacks of the live ranks, the notice of a stop
signal or a grow-back -- then the root cause and the summary.

What cannot apply here, said in one line by the run or refused before anything starts:

* MAX_RESTARTS / ELASTIC: the scheduler owns the allocation (requeue with ``sbatch --requeue`` instead);
* a cluster described by its login node only (``PROVIDER=hosts``, a shared filesystem): the run reaches no
  other node, so the skew check, the stall watchdog and the stack capture are not run (the scheduler's own
  ``--kill-on-bad-exit`` still ends a failed job, and the failing task is named from its output).
"""

from __future__ import annotations

from dataclasses import replace

from multinode.backends.base import Observe, RunContext
from multinode.backends.reach import EveryNode, LoginNodeOnly
from multinode.backends.slurm import follow
from multinode.backends.slurm.job import SlurmJobRun
from multinode.backends.slurm.script import SlurmJob, pick_mpi_plugin, plan_sbatch
from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.core.events import Events
from multinode.core.inventory import Inventory
from multinode.plan.launchers import EntryPoint
from multinode.plan.launchers.base import nproc_of
from multinode.plan.launchers.torchrun import root_cause_rank

UNCHECKED = ("the cluster is described by its login node: the software skew check, the stall watchdog and the stack "
             "capture need SSH to every node of the job and are not run")


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

    def start(self, ctx: RunContext, job: SlurmJob, events: Events, observe: Observe) -> SlurmJobRun:
        """Submit the batch job (NodeError: sbatch refused it) and follow it (:mod:`multinode.backends.slurm.job`)."""
        job_id = follow.submit(ctx.runner, job)
        nodes = [f"node-{i}" for i in range(ctx.spec.nodes)]
        return SlurmJobRun(ctx.runner, job, job_id, nodes, ctx.out, ctx.run_dir, events, observe).start()

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
