"""The SSH backend: the orchestrator itself runs every node's command over that node's SSH session.

The plan is a launcher's (:mod:`multinode.plan.launchers`: static, torchrun, mpirun): per node, the exact argv and
environment, wrapped by the runtime. The job runs as a :class:`multinode.ssh.job.JobRun`: lines streamed with
``[node-i]`` prefixes and saved per node, the first failure stops every node (after the run's look at the live
ranks), and with MAX_RESTARTS a lost node is started again and rejoins (torchrun's rendezvous takes it back;
the head hosts it, so its loss is final). Every stop follows the runner's stop policy (GRACE); the notice is the
job's (:meth:`multinode.ssh.job.JobRun.notice`), for a stop signal to the orchestrator and for growing back alike.
"""

from __future__ import annotations

from multinode.backends.base import RunContext
from multinode.backends.reach import EveryNode
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.core.outcome import Outcome
from multinode.plan.launchers import EntryPoint, LaunchPlan, launcher_for
from multinode.ssh.job import JobRun, Rejoin


class SshBackend:
    name = "ssh"

    def __init__(self, inventory: Inventory, spec: LaunchSpec):
        self.spec = spec
        self.launcher = launcher_for(spec)
        self.reach = EveryNode()
        self.job: JobRun | None = None  # the job while it runs (its notice)

    def nodes(self, inventory: Inventory) -> Inventory:
        return inventory.first(self.spec.nodes)

    def plan(self, ctx: RunContext, entry: EntryPoint) -> LaunchPlan:
        return self.launcher.plan(ctx.inv, ctx.spec, entry)

    def describe(self, ctx: RunContext, plan: LaunchPlan) -> str:
        lines = [plan.describe()]
        lines += [f"[{cmd.node}] shell: {ctx.runtime.wrap(cmd)}" for cmd in plan.commands]
        if not ctx.code.ours:
            manifest = ctx.code.project.manifest
            lines.append(f"sync {ctx.code.project.root}: {len(manifest.files)} files, {manifest.total_bytes} bytes "
                         f"to every node (only what changed since its last sync)")
        if ctx.spec.setup:
            lines.append(f"setup (once per node, again when it or the files it names change): {ctx.spec.setup}")
        return "\n".join(lines)

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        return spec.uses_mpi

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        return spec.rdzv_port  # mpirun's ranks get it as MASTER_PORT (launchers/mpirun.py)

    def finish_plan(self, ctx: RunContext, plan: LaunchPlan) -> LaunchPlan:
        return plan

    def record(self, ctx: RunContext, plan: LaunchPlan) -> None:
        (ctx.run_dir / "plan.json").write_text(plan.to_json())
        print(f"run {ctx.spec.run_id}: MODE={ctx.spec.mode} on {ctx.spec.nodes} node(s), world size "
              f"{plan.world_size}, logs in {ctx.run_dir}", file=ctx.out)

    def write_files(self, ctx: RunContext, plan: LaunchPlan, names: list[str] | None = None) -> None:
        for cmd in plan.commands:
            if names is None or cmd.node in names:
                for path, content in cmd.files.items():
                    ctx.runner.put_bytes(cmd.node, path, content.encode())

    def run(self, ctx: RunContext, plan: LaunchPlan) -> Outcome:
        spec = ctx.spec
        rejoin = Rejoin(budget=spec.max_restarts, wait=spec.rdzv_timeout, prepare=ctx.prepare_again,
                        exclude=(ctx.inv.head.name,)) if spec.max_restarts else None
        self.job = JobRun(ctx.runner, {cmd.node: ctx.runtime.wrap(cmd) for cmd in plan.commands}, run_id=spec.run_id,
                          log_dir=ctx.run_dir, deadline=spec.deadline, extra_stop=ctx.runtime.stop_line,
                          relabel=self.launcher.relabel(plan), rejoin=rejoin, before_stop=ctx.before_stop,
                          stalled=ctx.watchdog.stalled if ctx.watchdog else None, observe=ctx.observe)
        try:
            return self.job.run()
        finally:
            self.job = None

    def notice(self, ctx: RunContext) -> bool:
        job = self.job
        return job is not None and job.notice()

    def failed_rank(self, ctx: RunContext, plan: LaunchPlan, node: str, lines: list[str]) -> int | None:
        return self.launcher.failed_rank(lines)
