"""The SSH backend: the orchestrator itself runs every node's command over that node's SSH session.

The plan is a launcher's (:mod:`multinode.plan.launchers`: static, torchrun, mpirun): per node, the exact argv and
environment, wrapped by the runtime. The job runs as a :class:`multinode.ssh.job.JobRun`: lines streamed with
``[node-i]`` prefixes and saved per node, the first failure stops every node (after the run's look at the live
ranks), and with MAX_RESTARTS a lost node is started again and rejoins (torchrun's rendezvous takes it back;
the head hosts it, so its loss is final). With GRACE, every stop of the run waits the grace before SIGKILL and a
stop signal to the orchestrator is a notice to the ranks (:mod:`multinode.ssh.job`).
"""

from __future__ import annotations

from multinode.backends.base import JobEnd
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.plan.launchers import EntryPoint, LaunchPlan, launcher_for
from multinode.ssh.job import JobRun, Rejoin


class SshBackend:
    name = "ssh"
    reaches_every_node = True
    unchecked = ""

    def __init__(self, inventory: Inventory, spec: LaunchSpec):
        self.spec = spec
        self.launcher = launcher_for(spec)

    def nodes(self, inventory: Inventory) -> Inventory:
        return inventory.first(self.spec.nodes)

    def plan(self, run, entry: EntryPoint) -> LaunchPlan:
        return self.launcher.plan(run.inv, run.spec, entry)

    def describe(self, run, plan: LaunchPlan) -> str:
        lines = [plan.describe()]
        lines += [f"[{cmd.node}] shell: {run.runtime.wrap(cmd)}" for cmd in plan.commands]
        if not run.code.ours:
            manifest = run.code.project.manifest
            lines.append(f"sync {run.code.project.root}: {len(manifest.files)} files, {manifest.total_bytes} bytes "
                         f"to every node (only what changed since its last sync)")
        if run.spec.setup:
            lines.append(f"setup (once per node, again when it or the files it names change): {run.spec.setup}")
        return "\n".join(lines)

    def needs_mpi_ssh(self, spec: LaunchSpec) -> bool:
        return spec.uses_mpi

    def rendezvous_port(self, spec: LaunchSpec) -> int | None:
        return spec.rdzv_port  # mpirun's ranks get it as MASTER_PORT (launchers/mpirun.py)

    def finish_plan(self, run, plan: LaunchPlan) -> LaunchPlan:
        return plan

    def record(self, run, plan: LaunchPlan) -> None:
        (run.run_dir / "plan.json").write_text(plan.to_json())
        print(f"run {run.spec.run_id}: MODE={run.spec.mode} on {run.spec.nodes} node(s), world size "
              f"{plan.world_size}, logs in {run.run_dir}", file=run.out)

    def write_files(self, run, plan: LaunchPlan, names: list[str] | None = None) -> None:
        for cmd in plan.commands:
            if names is None or cmd.node in names:
                for path, content in cmd.files.items():
                    run.runner.put_bytes(cmd.node, path, content.encode())

    def run(self, run, plan: LaunchPlan, watchdog) -> JobEnd:
        spec = run.spec
        rejoin = Rejoin(budget=spec.max_restarts, wait=spec.rdzv_timeout, prepare=run.prepare_again,
                        exclude=(run.inv.head.name,)) if spec.max_restarts else None
        job = JobRun(run.runner, {cmd.node: run.runtime.wrap(cmd) for cmd in plan.commands}, run_id=spec.run_id,
                     log_dir=run.run_dir, deadline=spec.deadline, extra_stop=run.runtime.stop_line,
                     relabel=self.launcher.relabel(plan), rejoin=rejoin, before_stop=run.capture,
                     stalled=watchdog.stalled if watchdog else None, grace=spec.grace)
        results = job.run()
        return JobEnd({name: result.exit_code for name, result in results.items()}, stopped_by=job.stopped_by)

    def failed_rank(self, run, plan: LaunchPlan, node: str, lines: list[str]) -> int | None:
        return self.launcher.failed_rank(lines)
