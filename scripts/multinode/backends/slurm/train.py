"""``train`` on a cluster whose own scheduler runs the job (SLURM): the sbatch script planned by
:mod:`multinode.backends.slurm.script`, submitted and followed on the login node by :mod:`multinode.backends.slurm.follow`, and the same
summary as any run. The orchestrator dispatches here from its ``SCHEDULED`` registry."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TextIO

from multinode.core.config import LaunchSpec
from multinode.diagnose.capture import pick_root_cause
from multinode.core.errors import JobFailed, NodeError, UserError
from multinode.core.inventory import Inventory
from multinode.plan.job import plan_job, resolve_entry
from multinode.code.project import ResolvedProject
from multinode.plan.runtime import runtime_checks
from multinode.core.state import ClusterState
from multinode.diagnose.summary import RunSummary, describe, fetch_metrics, parse_result, result_from_metrics


def train(state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO) -> RunSummary | None:
    """The job as one sbatch script (:mod:`slurm_job`), submitted and followed on the login node (:mod:`slurm_run`)."""
    from multinode.backends.slurm import script as slurm_job
    from multinode.backends.slurm import follow as slurm_run

    if spec.max_restarts or spec.elastic:
        raise UserError("MAX_RESTARTS/ELASTIC are not planned for SLURM clusters; requeue with sbatch --requeue instead, "
                        "or leave them unset")
    if spec.nproc == "auto" or spec.setup or spec.env:
        raise UserError("NPROC=auto, SETUP and ENV are not planned for SLURM clusters yet; give NPROC a number, "
                        "install the project's requirements on the cluster and export variables in ARGS or the script")
    # A cluster on a shared filesystem is described by its login node alone: the scheduler has the nodes.
    shared = bool(inventory.extra.get("shared_fs"))
    if not shared:
        plan_job(inventory, spec)  # the same checks as any job (NODES, GPU, SCRIPT), nothing started
    entry, sync = resolve_entry(spec)
    inv = inventory if shared else inventory.first(spec.nodes)
    partition = inventory.extra.get("slurm_partition")
    if spec.dry_run:  # no I/O: the PMI plugin the cluster recorded at `up` (none known: mpirun)
        print(slurm_job.plan_sbatch(inv, spec, entry, inventory.extra.get("slurm_mpi"), partition).script,
              file=out, end="")
        return None
    from multinode.checks.preflight import preflight
    from multinode.ssh.runner import RemoteRunner
    from multinode.code.tarball import sync_code

    run_dir = state.run_dir(spec.run_id)
    start = time.monotonic()
    with RemoteRunner(inv, out=out) as runner:
        preflight(runner, checks=runtime_checks(inv), need_mpi_ssh=False,
                  port=None if spec.uses_mpi or shared else spec.rdzv_port, timeout=spec.preflight_timeout)
        plugin = slurm_job.pick_mpi_plugin(slurm_run.detect_mpi(runner)) if spec.uses_mpi else None
        job = slurm_job.plan_sbatch(inv, spec, entry, plugin, partition)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.sbatch").write_text(job.script)
        print(f"run {spec.run_id}: MODE={spec.mode} on {spec.nodes} node(s) x {spec.nproc} process(es) through "
              f"SLURM ({'srun --mpi=' + plugin if plugin else 'mpirun' if spec.uses_mpi else 'srun + torchrun'}), "
              f"logs in {run_dir}", file=out)
        if isinstance(sync, ResolvedProject):
            from multinode.code.prepare import prepare_project

            prepare_project(runner, spec, sync, out)  # WORKDIR synced incrementally, the -m module checked
        else:
            sync_code(runner, sync, subdir="code")
        outcome = slurm_run.run(runner, job, out, run_dir)
        metrics = fetch_metrics(runner, inv, spec, run_dir) if outcome.exit_code == 0 and not shared else None
    failed = {node: code for node, code, _ in outcome.failed_nodes}
    exit_codes = {f"node-{i}": failed.get(f"node-{i}", 0 if outcome.exit_code == 0 else None) for i in range(spec.nodes)}
    summary = RunSummary(run_id=spec.run_id, mode=spec.mode, nodes=spec.nodes, world_size=job.world_size,
                         exit_codes=exit_codes, wall_seconds=round(time.monotonic() - start, 2),
                         result=parse_result(outcome.lines) or result_from_metrics(metrics),
                         log_dir=str(run_dir), metrics=metrics)
    print(f"batch job {outcome.job_id}: {outcome.state}, exit code {outcome.exit_code}", file=out)
    if outcome.state == "COMPLETED" and outcome.exit_code == 0:
        (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
        print(describe(summary), file=out)
        return summary
    errors = [NodeError(node, "srun task", code, f"exited with code {code} (batch job {outcome.job_id}, {outcome.state})",
                        tail=outcome.node_lines(node)[-20:], log_path=str(run_dir / f"{node}.log"))
              for node, code, _ in outcome.failed_nodes]
    first = pick_root_cause(errors, errors[0]) if errors else NodeError(
        inv.head.name, "sbatch", outcome.exit_code, f"batch job {outcome.job_id} ended {outcome.state}",
        tail=outcome.lines[-20:])
    ranks = {node: rank for node, _, rank in outcome.failed_nodes}
    rank = ranks.get(first.node)
    if rank is None and not spec.uses_mpi:
        from multinode.plan.launchers.torchrun import root_cause_rank

        rank = root_cause_rank(outcome.node_lines(first.node))
    summary = RunSummary(**{**asdict(summary), "result": None, "failed_node": first.node, "failed_rank": rank})
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    raise JobFailed(first, rank=rank, summary=describe(summary))
