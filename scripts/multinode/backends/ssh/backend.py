"""The SSH backend: the orchestrator itself runs every node's command over that node's SSH session.

The plan is a launcher's (:mod:`multinode.plan.launchers`: static, torchrun, mpirun): per node, the exact argv and
environment, wrapped by the runtime. The job runs as a :class:`multinode.ssh.job.JobRun` -- the run's
:class:`~multinode.backends.base.JobHandle`: lines streamed with ``[node-i]`` prefixes and saved per node, each
node's part reporting its end; the run's attempt loop decides the rest (the first failure stops every node after
its look at the live ranks; with MAX_RESTARTS a lost node is started again and rejoins, torchrun's rendezvous taking
it back -- the head hosts it, so its loss is final). Every stop follows the runner's stop policy (GRACE).
"""

from __future__ import annotations

from multinode.backends.base import Observe, RunContext
from multinode.backends.reach import EveryNode
from multinode.core.config import LaunchSpec
from multinode.core.events import Events
from multinode.core.inventory import Inventory
from multinode.plan.launchers import EntryPoint, LaunchPlan, launcher_for
from multinode.ssh.job import JobRun


class SshBackend:
    name = "ssh"

    def __init__(self, inventory: Inventory, spec: LaunchSpec):
        self.spec = spec
        self.launcher = launcher_for(spec)
        self.reach = EveryNode()

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

    def start(self, ctx: RunContext, plan: LaunchPlan, events: Events, observe: Observe) -> JobRun:
        job = JobRun(ctx.runner, {cmd.node: ctx.runtime.wrap(cmd) for cmd in plan.commands}, run_id=ctx.spec.run_id,
                     log_dir=ctx.run_dir, events=events, extra_stop=ctx.runtime.stop_line,
                     relabel=self.launcher.relabel(plan), observe=observe)
        job.start()
        return job

    def failed_rank(self, ctx: RunContext, plan: LaunchPlan, node: str, lines: list[str]) -> int | None:
        return self.launcher.failed_rank(lines)
