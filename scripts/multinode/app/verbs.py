"""The verbs behind the CLI: up, down, status, train, logs, ssh, reap.

Each verb wires the one-way chain together -- config -> provider -> inventory -> launch plan ->
runtime -> remote runner -> logs/results -- and owns nothing else. ``train`` in order:

1. load the inventory and restrict it to NODES (user errors first, nothing started);
2. plan with the mode's launcher (pure; ``--dry-run`` stops here and prints it);
3. pre-flight every node in parallel (SSH, runtime, MPI SSH mesh, rendezvous port) and, in the same round,
   compare their software (multinode.checks.software); then the GPU smoke test on GPU nodes (device visible, kernels for
   its architecture, a matmul and a reduction);
4. sync the code to every node's own directory: our training package, or the user's project (WORKDIR,
   incremental; then SETUP and a -m module check, before any run directory exists: project_prepare.py);
5. run every node's command at once, streaming ``[node-i]`` lines and saving per-node logs; the
   first failure stops every node of the job (by run id) and is reported with node, rank and tail;
6. sweep: stop anything still tagged with the run id on every node, even after success;
7. summary: exit code per node, wall time, test accuracy, where logs and metrics are.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from multinode.backends.slurm import train as slurm_train
from multinode.core.config import ClusterSpec, LaunchSpec
from multinode.diagnose.capture import pick_root_cause
from multinode.core.errors import JobFailed, NodeError, UserError
from multinode.checks.gpu import gpu_smoke
from multinode.core.inventory import Inventory
from multinode.plan.job import plan_job
from multinode.plan.launchers import LaunchPlan, launcher_for
from multinode.code.project import ResolvedProject
from multinode.providers import get_provider
from multinode.plan.runtime import runtime_checks, stop_containers, to_shell
from multinode.core.state import ClusterState
from multinode.diagnose.summary import Phases, RunSummary, describe, fetch_metrics, parse_result, result_from_metrics

log = logging.getLogger(__name__)

# --- up / down / status ------------------------------------------------------------


def up(spec: ClusterSpec, assume_yes: bool = False) -> Inventory:
    state = ClusterState.for_cluster(spec.name)
    if state.exists():
        existing = state.load_inventory()
        raise UserError(
            f"cluster {spec.name!r} is already up with {len(existing.nodes)} nodes ({existing.provider}); "
            f"run 'make down' first or use another CLUSTER"
        )
    provider = get_provider(spec.provider)
    if hasattr(provider, "confirm"):
        provider.confirm(spec, assume_yes=assume_yes)
    inventory = provider.up(spec, state)
    print(f"cluster {inventory.cluster!r} is up: {len(inventory.nodes)} nodes ({inventory.provider}), subnet {inventory.subnet}")
    for node in inventory.nodes:
        print(f"  {node.name:8} {node.hostname:16} {node.private_ip:15} ssh {node.ssh_user}@{node.ssh_host}:{node.ssh_port}")
    return inventory


def down(cluster: str, provider: str | None = None, yes: bool = False) -> list[str]:
    state = ClusterState.for_cluster(cluster)
    name = _provider_of(state, provider)
    lines = get_provider(name).down(state, yes=yes)
    for line in lines:
        print(line)
    return lines


def _provider_of(state: ClusterState, provider: str | None) -> str:
    """Which provider made the cluster: the inventory says; without a readable one, the provider's own
    state file does (local.json / aws.json under provider/), else --provider, else local. `down` of a
    cluster whose inventory is damaged or gone still removes everything the provider made."""
    if state.exists():
        try:
            return state.load_inventory().provider
        except UserError:
            log.warning("%s is damaged: taking cluster %r down by its name", state.inventory_path, state.name)
    for name in ("aws", "local"):
        if (state.provider_dir / f"{name}.json").exists():
            return name
    return provider or "local"


def status(cluster: str) -> int:
    from multinode.checks.preflight import probe_ssh

    inventory = ClusterState.for_cluster(cluster).load_inventory()
    print(f"cluster {inventory.cluster!r} ({inventory.provider}, runtime {inventory.runtime}), subnet {inventory.subnet}")
    answers = probe_ssh(inventory)
    down_nodes = 0
    for node in inventory.nodes:
        ok, detail = answers[node.name]
        down_nodes += not ok
        state = "ssh ok" if ok else f"NO SSH ({detail})"
        print(f"  {node.name:8} {node.hostname:16} {node.private_ip:15} {node.accelerator:6} {state}")
    if inventory.extra.get("scheduler") == "slurm" and answers[inventory.nodes[0].name][0]:
        down_nodes += _print_sinfo(inventory)
    return 1 if down_nodes else 0


def _print_sinfo(inventory: Inventory) -> int:
    """The scheduler's view of the nodes, from the head (login) node; 1 if sinfo failed."""
    from multinode.ssh.runner import RemoteRunner
    from multinode.backends.slurm.script import sinfo_command

    with RemoteRunner(inventory) as runner:
        res = runner.run_on(inventory.nodes[0].name, sinfo_command(), timeout=15)
    print(f"SLURM (sinfo on {inventory.nodes[0].name}):")
    for line in (res.stdout or res.stderr or res.error or "").splitlines():
        print(f"  {line}")
    return 0 if res.ok else 1


# --- train ------------------------------------------------------------------------


def train(cluster: str, spec: LaunchSpec, out: TextIO | None = None) -> RunSummary | None:
    out = out or sys.stdout
    state = ClusterState.for_cluster(cluster)
    inventory = state.load_inventory()
    scheduler = inventory.extra.get("scheduler")
    if scheduler:  # the cluster's own scheduler runs the job: planner + executor of its own
        if scheduler not in SCHEDULED:
            raise UserError(f"cluster {cluster!r} has scheduler {scheduler!r}; supported: {', '.join(SCHEDULED)}")
        return SCHEDULED[scheduler](state, inventory, spec, out)
    plan, sync = plan_job(inventory, spec)
    inv = inventory.first(spec.nodes)
    shells = {cmd.node: to_shell(cmd, inv, spec.run_id) for cmd in plan.commands}
    project = sync if isinstance(sync, ResolvedProject) else None
    if spec.dry_run:
        print(plan.describe(), file=out)
        for node, line in shells.items():
            print(f"[{node}] shell: {line}", file=out)
        if project is not None:
            manifest = project.project.manifest
            print(f"sync {project.project.root}: {len(manifest.files)} files, {manifest.total_bytes} bytes "
                  f"to every node (only what changed since its last sync)", file=out)
        if spec.setup:
            print(f"setup (once per node, again when it or the files it names change): {spec.setup}", file=out)
        return None

    from multinode.ssh.runner import RemoteRunner

    launcher = launcher_for(spec)
    runner = RemoteRunner(inv, out=out)
    runner.prewarm()  # every node's login shell starts now, while the rest is imported and prepared
    with runner:  # closed however the rest ends
        from multinode.checks.preflight import preflight, start_mpi_sshds
        from multinode.code.prepare import prepare_project, remove_env_files, write_env_files
        from multinode.code.sync import read_manifest
        from multinode.plan.launchers.base import run_dir as node_run_dir
        from multinode.backends.ssh.job import Rejoin
        from multinode.checks.software import check_code, check_versions, probe_cache, versions_probe
        from multinode.code.tarball import sync_code, sync_mpi_credentials
        from multinode.diagnose.watchdog import StallWatchdog

        run_dir = state.run_dir(spec.run_id)
        start = time.monotonic()
        phases = Phases()
        # Host runtime: every node's software, in the pre-flight round (in containers every node runs the one image).
        probes = {n.name: versions_probe(inv.python, spec.uses_mpi, probe_cache(inv.workdir_for(n.name), inv.python,
                                                                               spec.uses_mpi))
                  for n in inv.nodes} if inv.runtime == "host" else None
        reads = {"versions": probes} if probes is not None else {}
        if project is not None:  # what each node holds of the project, for the sync: no round of its own
            reads["manifest"] = {n.name: read_manifest(inv, n.name) for n in inv.nodes}
        answers = preflight(
            runner,
            checks=runtime_checks(inv),
            # In containers, mpirun's peers are sshds the run starts itself (checked once they are up).
            need_mpi_ssh=spec.uses_mpi and inv.runtime == "host",
            port=None if spec.uses_mpi else spec.rdzv_port,
            timeout=spec.preflight_timeout,
            reads=reads,
        )
        if probes is not None:
            check_versions(inv, answers["versions"], spec.skew)
        phases.mark("pre-flight")
        if spec.uses_gpu:
            gpu_smoke(runner, inv, spec)
            phases.mark("GPU smoke test")
        if project is not None:
            # The project, its SETUP and its module are ready on every node before the run directory exists:
            # a refused job leaves no trace (the nodes keep the synced files and environments for next time).
            prepare_project(runner, spec, project, out, manifests=answers["manifest"])
        else:
            sync_code(runner, sync, subdir="code")
            check_code(runner, sync, spec.skew)  # a project's files are checked by its own manifest
        phases.mark("sync")
        # Nothing is written here before pre-flight passed: a refused job leaves no run directory.
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.json").write_text(plan.to_json())
        print(f"run {spec.run_id}: MODE={spec.mode} on {spec.nodes} node(s), world size {plan.world_size}, "
              f"logs in {run_dir}", file=out)
        if spec.uses_mpi:
            sync_mpi_credentials(runner)
        for cmd in plan.commands:
            for path, content in cmd.files.items():
                runner.write_file(cmd.node, path, content)

        def prepare_again(node: str) -> None:
            """A node that comes back (rebooted or replaced) gets the code and the plan's files again."""
            if project is not None:
                prepare_project(runner, spec, project, out, names=[node])
                write_env_files(runner, spec, names=[node])
            else:
                sync_code(runner, sync, subdir="code", names=[node])
            for path, content in plan.command_for(node).files.items():
                runner.write_file(node, path, content)

        # Elastic (MAX_RESTARTS >= 1): a lost node is started again and rejoins the rendezvous, which
        # its peers' torchrun agents keep open for RDZV_TIMEOUT; the head hosts it, so its loss is final.
        rejoin = Rejoin(budget=spec.max_restarts, wait=spec.rdzv_timeout, prepare=prepare_again,
                        exclude=(inv.head.name,)) if spec.max_restarts else None
        captured: list = []  # the ranks still alive when the job failed, looked at before the gang-stop

        def capture_live_ranks(failure: NodeError) -> None:
            """One look suffices when a node crashed on its own (only a stopped or stuck-in-the-kernel rank
            outranks it); a second look, half a second later, tells a stuck rank from a passing one. A node
            whose session was lost is not asked (it would cost the 3 s channel timeout)."""
            from multinode.diagnose.capture import capture, own_failure

            lost = failure.returncode is None and "lost its SSH session" in failure.message
            crashed = lost or (failure.returncode is not None and own_failure([failure]) is not None)
            names = [n.name for n in inv.nodes if not (lost and n.name == failure.node)]
            captured.append(capture(runner, spec.run_id, samples=1 if crashed else 2, names=names))
            runner.say(f"captured the stacks of {len(captured[0].dumps)} live rank(s) in {captured[0].seconds:.1f} s")
        watchdog = StallWatchdog(runner, spec.run_id, run_dir, spec.stall_timeout,
                                 {n.name: node_run_dir(inv, n.name, spec.run_id) for n in inv.nodes}) \
            if spec.stall_timeout else None
        try:
            write_env_files(runner, spec)
            if spec.uses_mpi and inv.runtime == "docker":
                start_mpi_sshds(runner, spec.run_id)
            if watchdog is not None:
                watchdog.start()
            phases.mark("start")
            results = runner.run(shells, run_id=spec.run_id, log_dir=run_dir, deadline=spec.deadline,
                                 extra_stop=lambda node: stop_containers(inv, spec.run_id, node),
                                 relabel=launcher.relabel(plan), rejoin=rejoin,
                                 before_stop=capture_live_ranks, stalled=watchdog.stalled if watchdog else None)
            phases.mark("job")
        except JobFailed as err:
            phases.mark("job")
            summary = _failure_summary(err, launcher, spec, plan, run_dir, time.monotonic() - start,
                                       captured[0] if captured else None, phases.seconds)
            raise JobFailed(summary[0], rank=summary[1].failed_rank, summary=describe(summary[1])) from None
        finally:
            if watchdog is not None:
                watchdog.stop()
            runner.stop_all(spec.run_id, extra_stop=lambda node: stop_containers(inv, spec.run_id, node))
            remove_env_files(runner, spec)
            phases.mark("sweep")
        metrics = fetch_metrics(runner, inv, spec, run_dir)
    head_log = run_dir / f"{inv.head.name}.log"
    summary = RunSummary(
        run_id=spec.run_id, mode=spec.mode, nodes=spec.nodes, world_size=plan.world_size,
        exit_codes={name: r.exit_code for name, r in results.items()},
        wall_seconds=round(time.monotonic() - start, 2),
        result=(parse_result(head_log.read_text(errors="replace").splitlines()) if head_log.exists() else None)
        or result_from_metrics(metrics),
        log_dir=str(run_dir), metrics=metrics, phases=phases.seconds,
    )
    phases.mark("summary")
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    print(describe(summary), file=out)
    return summary


SCHEDULED = {"slurm": slurm_train.train}  # clusters whose own scheduler runs the job (inventory.extra["scheduler"])


def _failure_summary(err: JobFailed, launcher, spec: LaunchSpec, plan: LaunchPlan, run_dir: Path, wall: float,
                     captured=None, phases: dict[str, float] | None = None):
    """The root cause, from the ranks alive when the job failed (multinode.diagnose.capture) and the nodes' logs:
    a stopped or uninterruptible rank; else the first node that failed on its own (its log does not read like a
    reaction to another's failure); else a rank stuck outside any collective; else the first failure."""
    from multinode.diagnose.capture import root_cause, save

    results = getattr(err, "results", {}) or {}
    failures = [r.error for r in sorted(results.values(), key=lambda r: r.finished or 0) if getattr(r, "error", None)]
    first = pick_root_cause(failures, err.first) if failures else err.first
    log_path = Path(first.log_path) if first.log_path else run_dir / f"{first.node}.log"
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else first.tail
    rank = launcher.failed_rank(lines)
    stacks = str(save(run_dir / "stacks", captured.per_node, captured.errors)) if captured else None
    culprit = root_cause(captured.dumps, failures) if captured else None
    if culprit is not None:
        log_path = run_dir / f"{culprit.node}.log"
        tail = log_path.read_text(errors="replace").splitlines()[-10:] if log_path.exists() else []
        first = NodeError(culprit.node, "job", None, f"hung: {culprit.describe()}", tail=tail, log_path=str(log_path))
        rank = culprit.rank
    summary = RunSummary(
        run_id=spec.run_id, mode=spec.mode, nodes=spec.nodes, world_size=plan.world_size,
        exit_codes={name: r.exit_code for name, r in results.items()},
        wall_seconds=round(wall, 2), result=None, log_dir=str(run_dir), metrics=None,
        failed_node=first.node, failed_rank=rank, cause=culprit.describe() if culprit else None, stacks=stacks,
        phases=phases,
    )
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    return first, summary


# --- stacks -------------------------------------------------------------------------


def stacks(cluster: str, run_id: str | None = None, out: TextIO | None = None) -> int:
    """The Python stacks of every live rank on every node (of ``run_id``, or of every run found), identical
    stacks printed once with the ranks that share them. Read-only: the job keeps running."""
    from multinode.diagnose.capture import capture, group_stacks
    from multinode.ssh.runner import RemoteRunner

    out = out or sys.stdout
    inventory = ClusterState.for_cluster(cluster).load_inventory()
    with RemoteRunner(inventory, out=out) as runner:
        found = capture(runner, run_id, samples=1)
    for node, why in found.errors.items():
        print(f"{node}: no stacks ({why})", file=out)
    runs = sorted({d.run_id for d in found.dumps})
    if not runs:
        what = f"run {run_id!r}" if run_id else "any run"
        raise UserError(f"no live rank of {what} on cluster {cluster!r}; 'make stacks' reads a running job (make train)")
    for rid in runs:
        dumps = [d for d in found.dumps if d.run_id == rid]
        ranks = [d for d in dumps if not d.parent_is_rank]
        print(f"run {rid}: {len(ranks)} live rank(s) on {len({d.node for d in dumps})} node(s), "
              f"captured in {found.seconds:.1f} s", file=out)
        print(group_stacks(dumps), file=out)
    return 0


# --- logs / ssh / reap --------------------------------------------------------------


def logs(cluster: str, run_id: str | None = None, node: str | None = None) -> None:
    state = ClusterState.for_cluster(cluster)
    runs = sorted(p for p in state.runs_dir.glob("*") if p.is_dir()) if state.runs_dir.exists() else []
    if not runs:
        raise UserError(f"cluster {cluster!r} has no runs yet; run 'make train' first")
    run = state.run_dir(run_id) if run_id else runs[-1]
    if not run.exists():
        raise UserError(f"no run {run_id!r}; runs are: {', '.join(p.name for p in runs[-5:])}")
    files = sorted(run.glob("node-*.log"))
    if node is not None:
        name = f"node-{node}" if str(node).isdigit() else str(node)
        files = [f for f in files if f.stem == name]
        if not files:
            raise UserError(f"run {run.name} has no log for node {node!r}")
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            print(f"[{path.stem}] {line}")
    summary = run / "summary.json"
    if summary.exists():
        print(summary.read_text())


def ssh_argv(inventory: Inventory, node_key: str) -> list[str]:
    node = inventory.node(node_key)
    return [
        "ssh", "-i", inventory.ssh_key, "-p", str(node.ssh_port),
        "-o", f"UserKnownHostsFile={inventory.known_hosts}", "-o", "StrictHostKeyChecking=yes",
        f"{node.ssh_user}@{node.ssh_host}",
    ]


def ssh(cluster: str, node_key: str, command: list[str]) -> int:
    inventory = ClusterState.for_cluster(cluster).load_inventory()
    argv = ssh_argv(inventory, node_key) + ([shlex.join(command)] if command else [])
    os.execvp(argv[0], argv)
    return 0  # not reached


def reap(region: str, cluster: str | None, yes: bool) -> None:
    get_provider("aws")  # one clear line when the AWS provider is not available
    from multinode.providers.aws.provider import reap as aws_reap

    for line in aws_reap(region=region, cluster=cluster, yes=yes):
        print(line)
