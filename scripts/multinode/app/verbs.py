"""The verbs behind the CLI: up, down, status, train, logs, report, stacks, ssh, reap.

Each verb loads the cluster's state and calls the one module that does the work: a provider (up, down, reap),
the run (train: :mod:`multinode.app.run`), the runner (status, stacks); it owns nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from multinode.app.netcheck import netcheck as measure_network
from multinode.app.run import Run
from multinode.backends.slurm.script import sinfo_command
from multinode.checks.preflight import probe_ssh
from multinode.core.config import ClusterSpec, LaunchSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, node_name
from multinode.core import rundir
from multinode.core.rundir import RunDir
from multinode.core.sources import Settled
from multinode.core.state import ClusterState
from multinode.diagnose.capture import capture
from multinode.diagnose.report import group_stacks
from multinode.diagnose.run_report import write as write_report
from multinode.diagnose.summary import RunSummary
from multinode.providers import get_provider
from multinode.providers.aws.readiness import Bootstrap, software_summary
from multinode.providers.local import imds as local_imds
from multinode.ssh.runner import RemoteRunner

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
    inventory = ClusterState.for_cluster(cluster).load_inventory()
    print(f"cluster {inventory.cluster!r} ({inventory.provider}, runtime {inventory.runtime}), subnet {inventory.subnet}")
    # With the answer, the node's ready marker if its bootstrap wrote one (EC2 nodes): what the jobs run on.
    answers = probe_ssh(inventory, command=f"uptime -p 2>/dev/null || uptime; cat {Bootstrap().ready} 2>/dev/null; true")
    down_nodes = 0
    for node in inventory.nodes:
        ok, detail = answers[node.name]
        down_nodes += not ok
        state = "ssh ok" if ok else f"NO SSH ({detail})"
        print(f"  {node.name:8} {node.hostname:16} {node.private_ip:15} {node.accelerator:6} {state}")
        software = software_summary(detail) if ok else None
        if software:
            print(f"  {'':8} {software}")
    if inventory.extra.get("scheduler") == "slurm" and answers[inventory.nodes[0].name][0]:
        down_nodes += _print_sinfo(inventory)
    return 1 if down_nodes else 0


def _print_sinfo(inventory: Inventory) -> int:
    """The scheduler's view of the nodes, from the head (login) node; 1 if sinfo failed."""
    with RemoteRunner(inventory) as runner:
        res = runner.run_on(inventory.nodes[0].name, sinfo_command(), timeout=15)
    print(f"SLURM (sinfo on {inventory.nodes[0].name}):")
    for line in (res.stdout or res.stderr or res.error or "").splitlines():
        print(f"  {line}")
    return 0 if res.ok else 1


# --- train ------------------------------------------------------------------------


def resumable_run(state: ClusterState) -> str:
    """RESUME=1: the cluster's latest run, if it did not finish (preempted, failed, interrupted, or the orchestrator
    itself stopped before its summary); one line naming what there is otherwise. (Summaries written before they
    named their outcome say it by their failed node or preempted report.)"""
    known = rundir.runs(state.runs_dir)
    if not known:
        raise UserError(f"RESUME=1 but cluster {state.name!r} has no run to continue; run 'make train' without RESUME")
    latest = known[-1]
    try:
        summary = json.loads(latest.summary.read_text())
    except (OSError, ValueError):
        return latest.run_id  # stopped before its summary: it may have snapshots
    unfinished = summary.get("failed_node") or summary.get("preempted")
    if summary.get("outcome", "failed" if unfinished else "succeeded") != "succeeded":
        return latest.run_id
    raise UserError(f"RESUME=1 but the latest run {latest.run_id} finished; nothing to continue "
                    f"(make train without RESUME starts a new run)")


def resumed_run(state: ClusterState, spec: LaunchSpec) -> str:
    """RESUME=1 with a run id given (``--run-id``, ``MULTINODE_RUN_ID``): that run, recorded here or not (another
    machine, the cluster made anew: its copies are in CHECKPOINT_URL under its id); one line when there is nowhere
    to read it from."""
    if not state.run_dir(spec.run_id).is_dir() and not spec.checkpoint_url:
        raise UserError(f"RESUME=1 --run-id {spec.run_id}: cluster {state.name!r} has no such run and no CHECKPOINT_URL "
                        f"is given to read its snapshots from; add CHECKPOINT_URL=s3://... (the run's own), or drop "
                        f"the run id to continue the cluster's latest run")
    return spec.run_id


def train(cluster: str, spec: LaunchSpec, out: TextIO | None = None, settled: Settled | None = None,
          named_run: bool = False) -> RunSummary | None:
    """One run of ``spec`` on the cluster (:class:`multinode.app.run.Run`); None for a dry run. ``named_run``: the
    run id was given (RESUME=1 then continues that run, :func:`resumed_run`, not the cluster's latest).

    With a task file (``settled.task``) a real run says it read it; a dry run ends with where each value came
    from. Without one the output is what it always was."""
    state = ClusterState.for_cluster(cluster)
    task = settled.task if settled else None
    if spec.resume and not spec.dry_run:
        spec = replace(spec, run_id=resumed_run(state, spec) if named_run else resumable_run(state))
        where = " (on the nodes, else in CHECKPOINT_URL)" if spec.checkpoint_url else ""
        print(f"RESUME=1: continuing run {spec.run_id} from its freshest snapshot{where}", file=out or sys.stdout)
    try:
        inventory = state.load_inventory()
        run = Run(state, inventory, spec, out)
        if task and not spec.dry_run:
            print(f"task file {task.shown}: {', '.join(k for k in task.values if k not in task.implied)} "
                  f"(flags and make variables win over it; DRY_RUN=1 shows each value's source)", file=run.out)
        summary = run.execute()
    except UserError as err:  # "NODES=3 but cluster 'dev' has 2 nodes": say that nodes: 3 is the task file's
        if not task:
            raise
        raise settled.located(err) from None
    if task and spec.dry_run:
        print(settled.describe(spec), file=run.out)
    return summary


def netcheck(cluster: str, nodes: int | None = None, out: TextIO | None = None) -> None:
    """``make netcheck``: the link matrix and an all_reduce sweep on ``nodes`` of the cluster (all by default)."""
    state = ClusterState.for_cluster(cluster)
    inventory = state.load_inventory()
    count = len(inventory.nodes) if nodes is None else int(nodes)
    if not 2 <= count <= len(inventory.nodes):
        raise UserError(f"NODES={count}: netcheck measures between 2 and the cluster's {len(inventory.nodes)} nodes; "
                        f"use NODES=2..{len(inventory.nodes)}")
    measure_network(state, inventory, LaunchSpec(nodes=count), out)


def preempt(cluster: str, node: str, in_seconds: float = 0.0, notice: str = "interruption") -> str:
    """``make preempt NODE=n [IN=s] [NOTICE=rebalance]``: a spot interruption notice (or a rebalance
    recommendation) on a local node's metadata endpoint (EC2 sends its own); the line to print."""
    local_imds.check_notice(notice)
    inventory = ClusterState.for_cluster(cluster).load_inventory()
    if not inventory.extra.get("metadata_endpoint"):
        raise UserError(f"cluster {cluster!r} ({inventory.provider}) serves no metadata endpoint: make preempt arms a "
                        f"notice on local nodes (EC2 sends its own two-minute notices)")
    return local_imds.preempt(cluster, inventory.node(node).name, in_seconds, notice=notice)


# --- stacks -------------------------------------------------------------------------


def stacks(cluster: str, run_id: str | None = None, out: TextIO | None = None) -> int:
    """The Python stacks of every live rank on every node (of ``run_id``, or of every run found), identical
    stacks printed once with the ranks that share them. Read-only: the job keeps running."""
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
    run = _run_dir(ClusterState.for_cluster(cluster), cluster, run_id)
    files = sorted(run.glob("node-*.log"))
    if node is not None:
        name = node_name(node)
        files = [f for f in files if f.stem == name]
        if not files:
            raise UserError(f"run {run.name} has no log for node {node!r}")
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            print(f"[{path.stem}] {line}")
    summary = RunDir(run).summary
    if summary.exists():
        print(summary.read_text())


def report(cluster: str, run_id: str | None = None) -> Path:
    """``make report``: the run's page (:mod:`multinode.diagnose.run_report`) written in its run directory (the
    latest run's without RUN); its path printed."""
    run = _run_dir(ClusterState.for_cluster(cluster), cluster, run_id)
    path = write_report(run)
    print(path)
    return path


def _run_dir(state: ClusterState, cluster: str, run_id: str | None) -> Path:
    """The run ``run_id`` (the latest without one); a UserError naming the runs there are otherwise."""
    known = rundir.runs(state.runs_dir)
    if not known:
        raise UserError(f"cluster {cluster!r} has no runs yet; run 'make train' first")
    run = state.run_dir(run_id) if run_id else known[-1].path
    if not run.exists():
        raise UserError(f"no run {run_id!r}; runs are: {', '.join(r.run_id for r in known[-5:])}")
    return run


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
    from multinode.providers.aws.reap import reap as aws_reap

    for line in aws_reap(region=region, cluster=cluster, yes=yes):
        print(line)
