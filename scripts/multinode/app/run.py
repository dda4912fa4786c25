"""One ``make train``: the run as one object with named phases, the same for every backend.

    plan -> pre-flight -> prepare -> launch -> watch -> (diagnose) -> summarize

:meth:`Run.execute` is the template (torch elastic's ``SimpleElasticAgent._invoke_run`` is the model); each
phase is a method, and what differs between backends -- how the job is planned and shown, which pre-flight
checks apply, how it starts, is watched and stops -- is the backend's (:mod:`multinode.backends`: ``ssh``, a
command on every node; ``slurm``, one batch job through the cluster's scheduler). The runtime (host or
container) is one object bound to the inventory and run id (:mod:`multinode.plan.runtime`).

1. **plan** (pure; ``--dry-run`` stops here and prints it): the job against the cluster (NODES, GPUs), the
   entry point (our trainer or the user's project) and the backend's plan;
2. **claim**: the cluster is this run's until it ends (:mod:`multinode.checks.claim`): a run in progress refuses
   this one in one line (or, queued, this one waits); a SLURM site reached through its login node claims nothing
   (its scheduler queues jobs);
   **pre-flight**, every node in parallel: SSH, the runtime's checks, the MPI SSH mesh, the rendezvous port,
   and in the same round the software probe (skew) and what each node holds of the code; then the GPU smoke
   test on GPU nodes. A refused job has started nothing and leaves no run directory;
3. **prepare**: one incremental sync of the code (our trainer or WORKDIR), SETUP, the -m module check, the
   run directory, the plan's files, the ENV files, the MPI credentials;
4. **launch** and 5. **watch**: the backend's, with the stall watchdog polling every node; a failure, stall or
   deadline first lets :meth:`Run.capture` look at the live ranks, then stops the job on every node;
6. **diagnose** (a failed plan): the root cause from the ranks alive at failure time and the nodes' logs;
7. **summarize**: exit codes, wall time, result, phases -- ``summary.json`` is written here and nowhere else.
The sweep (every process tagged with the run id, and the runtime's containers) runs however the job ended.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from typing import TextIO

from multinode.backends import backend_for
from multinode.backends.base import Backend, JobEnd
from multinode.checks.claim import Claim
from multinode.checks.gpu import gpu_smoke
from multinode.checks.links import connection_error, link_check
from multinode.checks.preflight import preflight, start_mpi_sshds
from multinode.checks.software import check_code, check_versions, probe_cache, versions_probe
from multinode.code.credentials import sync_mpi_credentials
from multinode.code.prepare import prepare_project, remove_env_files, write_env_files
from multinode.code.project import ResolvedProject, resolve_entry
from multinode.code.sync import read_manifest
from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED, JobFailed, NodeError, Preempted
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.core.state import ClusterState
from multinode.diagnose.capture import Capture, capture
from multinode.diagnose.rank import log_lines, own_failure, pick_root_cause, root_cause
from multinode.diagnose.report import save
from multinode.diagnose.summary import (Phases, RunSummary, describe, fetch_metrics, parse_preempted, parse_result,
                                        parse_resumed, result_from_metrics)
from multinode.diagnose.watchdog import StallWatchdog
from multinode.plan.request import check_gpu_request
from multinode.plan.runtime import Runtime, runtime_for
from multinode.ssh.runner import RemoteRunner


def plan_job(inventory: Inventory, spec: LaunchSpec):
    """The plan phase alone, as a function: (the backend's plan, the code it syncs). No I/O beyond reading the
    code on the control machine."""
    run = Run(ClusterState.for_cluster(inventory.cluster), inventory, spec)
    return run.plan(), run.code


class Run:
    """One job on one cluster, from plan to summary (see the module doc)."""

    def __init__(self, state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO | None = None):
        self.state, self.spec, self.out = state, spec, out or sys.stdout
        self.backend: Backend = backend_for(inventory, spec)
        self.inv: Inventory = self.backend.nodes(inventory)
        self.runtime: Runtime = runtime_for(self.inv, spec.run_id)
        self.run_dir = state.run_dir(spec.run_id)
        self.phases = Phases()
        self.code: ResolvedProject | None = None
        self.backend_plan = None  # the backend's plan: a LaunchPlan (ssh), a SlurmJob (slurm)
        self.runner: RemoteRunner | None = None
        self.captured: Capture | None = None
        self.links: dict | None = None  # the link check's report (pre-flight, or after a broken connection)
        self.summary: RunSummary | None = None  # as saved, however the run ended
        self.started_at: float | None = None  # Unix time the job was launched
        self.resumed: dict | None = None  # our trainer's RESUMED report: the snapshot this run continued from
        self._start = time.monotonic()

    # --- the template ------------------------------------------------------------------

    def execute(self) -> RunSummary | None:
        self.backend_plan = self.plan()
        if self.spec.dry_run:
            print(self.backend.describe(self, self.backend_plan), file=self.out)
            return None
        runner = self.runner = RemoteRunner(self.inv, out=self.out)
        runner.prewarm()  # every node's login shell starts now, while the rest is prepared
        with runner, self.claim():  # the claim is given back, then the connections closed, however the rest ends
            self.backend_plan = self.prepare(self.backend_plan, self.preflight())
            try:
                watchdog = self.launch()
                end = self.watch(watchdog)
            except JobFailed as err:
                raise self.diagnose(self.backend_plan, err) from None
            finally:
                self.sweep()
            metrics = fetch_metrics(runner, self.inv, self.spec, self.run_dir) if self.backend.reaches_every_node \
                else None
        return self.summarize(self.backend_plan, end, metrics)

    # --- phases --------------------------------------------------------------------------

    def plan(self):
        """The job checked against the cluster and planned; nothing runs, nothing is written."""
        check_gpu_request(self.inv, self.spec)
        self.code = resolve_entry(self.spec)
        return self.backend.plan(self, self.code.entry)

    def claim(self) -> AbstractContextManager:
        """The cluster held for this run until the run ends, taken on entry (PreflightFailed, one line, when another
        run holds it and this one does not wait)."""
        if not self.backend.reaches_every_node:
            return nullcontext()
        return Claim(self.runner, self.spec.run_id, wait=self.spec.queue)  # QUEUE=1: wait instead of being refused

    def preflight(self) -> dict[str, str]:
        """Every node can run the job (PreflightFailed, one line, otherwise); the nodes' code manifests."""
        spec, inv = self.spec, self.inv
        compare = self.runtime.compares_software and self.backend.reaches_every_node
        reads: dict[str, dict[str, str]] = {}
        if compare:
            reads["versions"] = {n.name: versions_probe(inv.python, spec.uses_mpi,
                                                        probe_cache(inv.workdir_for(n.name), inv.python, spec.uses_mpi))
                                 for n in inv.nodes}
        reads["manifest"] = {n.name: read_manifest(inv, n.name, self.code.subdir) for n in inv.nodes}
        answers = preflight(self.runner, checks=self.runtime.checks(),
                            need_mpi_ssh=self.backend.needs_mpi_ssh(spec) and self.runtime.mpi_peers_are_nodes,
                            port=self.backend.rendezvous_port(spec), timeout=spec.preflight_timeout, reads=reads)
        if compare:
            check_versions(inv, answers["versions"], spec.skew)
        elif self.runtime.compares_software and len(inv.nodes) > 1:
            self.runner.say(self.backend.unchecked)
        self.phases.mark("pre-flight")
        self.check_links(spec.linkcheck)
        if spec.uses_gpu:
            gpu_smoke(self.runner, inv, spec)
            self.phases.mark("GPU smoke test")
        return answers["manifest"]

    def check_links(self, mode: str, after_failure: bool = False) -> None:
        """Every node's links to its ring neighbours (multinode.checks.links), on ``RDZV_PORT + 1``: refused or
        warned at pre-flight per LINKCHECK; measured only (``report``) after a failure that read like a broken
        connection, while the nodes still answer."""
        if not self.backend.reaches_every_node or len(self.inv.nodes) < 2 or mode == "off":
            return
        report = link_check(self.runner, self.inv, mode, self.spec.rdzv_port + 1)
        self.links = {**report.to_json(), "after_failure": after_failure}
        if not after_failure:
            self.phases.mark("link check")

    def prepare(self, plan, manifests: dict[str, str]):
        """Code, SETUP and the module ready on every node, then the run directory and the job's files."""
        runner, spec = self.runner, self.spec
        # Before the run directory exists: a refused job leaves no trace (the nodes keep what was synced).
        prepare_project(runner, spec, self.code, self.out, manifests=manifests)
        if self.code.ours:  # every node holds exactly the files the sync sent (a project is vouched for by its manifest)
            tree = self.code.project
            check_code(runner, [(tree.root / rel, f"{self.code.subdir}/{rel}") for rel in tree.manifest.files], spec.skew)
        plan = self.backend.finish_plan(self, plan)
        self.phases.mark("sync")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.backend.record(self, plan)
        if spec.uses_mpi:
            sync_mpi_credentials(runner)
        self.backend.write_files(self, plan)
        return plan

    def prepare_again(self, node: str) -> None:
        """A node that comes back (rebooted or replaced) gets the code, the job's files and the ENV file again."""
        prepare_project(self.runner, self.spec, self.code, self.out, names=[node])
        write_env_files(self.runner, self.spec, names=[node])
        self.backend.write_files(self, self.backend_plan, names=[node])

    def launch(self) -> StallWatchdog | None:
        """What must be in place the moment the job starts (inside the sweep's reach): the ENV files, the
        runtime's MPI sshds, the stall watchdog."""
        write_env_files(self.runner, self.spec)
        if self.spec.uses_mpi and not self.runtime.mpi_peers_are_nodes:
            start_mpi_sshds(self.runner, self.spec.run_id)
        watchdog = self.watchdog()
        if watchdog is not None:
            watchdog.start()
        self.phases.mark("start")
        self.started_at = time.time()
        return watchdog

    def watch(self, watchdog: StallWatchdog | None) -> JobEnd:
        """The backend runs the job and watches it until it ends (JobFailed when it failed)."""
        try:
            return self.backend.run(self, self.backend_plan, watchdog)
        finally:
            if watchdog is not None:
                watchdog.stop()
            self.phases.mark("job")

    def watchdog(self) -> StallWatchdog | None:
        if not self.spec.stall_timeout or not self.backend.reaches_every_node:
            return None
        run_dirs = {n.name: node_run_dir(self.inv, n.name, self.spec.run_id) for n in self.inv.nodes}
        return StallWatchdog(self.runner, self.spec.run_id, self.run_dir, self.spec.stall_timeout, run_dirs)

    def capture(self, failure: NodeError) -> None:
        """The backend's look at the live ranks before it stops a failed job. One look suffices when a node
        crashed on its own (only a stopped or stuck-in-the-kernel rank outranks it); a second look, half a second
        later, tells a stuck rank from a passing one. A node whose session was lost is not asked (it would cost
        the 3 s channel timeout)."""
        if not self.backend.reaches_every_node:
            return
        lost = failure.returncode is None and "lost its SSH session" in failure.message
        crashed = lost or (failure.returncode is not None and own_failure([failure]) is not None)
        names = [n.name for n in self.inv.nodes if not (lost and n.name == failure.node)]
        self.captured = capture(self.runner, self.spec.run_id, samples=1 if crashed else 2, names=names)
        self.runner.say(f"captured the stacks of {len(self.captured.dumps)} live rank(s) in "
                        f"{self.captured.seconds:.1f} s")

    def sweep(self) -> None:
        """Stop anything still tagged with the run id on every node (and the runtime's containers), even after
        success; remove the ENV files."""
        self.runner.stop_all(self.spec.run_id, extra_stop=self.runtime.stop_line)
        remove_env_files(self.runner, self.spec)
        self.phases.mark("sweep")

    def diagnose(self, plan, err: JobFailed) -> JobFailed:
        """The root cause: a stopped or uninterruptible rank; else the first node that failed on its own (its log
        does not read like a reaction to another's failure); else a rank stuck outside any collective; else the
        first failure. Saves the summary and returns the error the user sees."""
        failures = err.failures or [err.first]
        first = pick_root_cause(failures, err.first)
        rank = self.backend.failed_rank(self, plan, first.node, log_lines(first, self.run_dir))
        culprit = root_cause(self.captured.dumps, failures) if self.captured else None
        if culprit is not None:
            log_path = self.run_dir / f"{culprit.node}.log"
            tail = log_path.read_text(errors="replace").splitlines()[-10:] if log_path.exists() else []
            first = NodeError(culprit.node, "job", None, f"hung: {culprit.describe()}", tail=tail, log_path=str(log_path))
            rank = culprit.rank
        stacks = str(save(self.run_dir / "stacks", self.captured.per_node, self.captured.errors)) \
            if self.captured else None
        logs = [self.run_dir / f"{n.name}.log" for n in self.inv.nodes]
        self.resumed = self._resumed_from(logs)
        if any(connection_error(p.read_text(errors="replace").splitlines()) for p in logs if p.exists()):
            self.check_links("report", after_failure=True)
        summary = self._summary(plan, err.exit_codes, result=None, metrics=None, failed_node=first.node,
                                failed_rank=rank, cause=culprit.describe() if culprit else None, stacks=stacks)
        self.save(summary)
        return JobFailed(first, rank=rank, summary=describe(summary))

    def summarize(self, plan, end: JobEnd, metrics: str | None) -> RunSummary:
        head_log = self.run_dir / f"{self.inv.head.name}.log"
        lines = head_log.read_text(errors="replace").splitlines() if head_log.exists() else []
        result = parse_result(end.lines or lines) or result_from_metrics(metrics)
        self.resumed = parse_resumed(end.lines or lines)
        preempted = None
        if EXIT_PREEMPTED in end.exit_codes.values():  # ranks stopped on a notice (training/preempt.py)
            preempted = parse_preempted(end.lines or lines) or {"notice": "a rank exited 75 (preempted) with no report"}
            if end.stopped_by:  # the orchestrator itself was stopped: its own notice, not the cluster's
                preempted["stopped_by"] = end.stopped_by
        summary = self._summary(plan, end.exit_codes, result=result, metrics=metrics, preempted=preempted)
        self.phases.mark("summary")
        self.save(summary)
        if preempted is not None:
            raise Preempted(describe(summary))  # exit 75: not a failure, and the summary says how to resume
        print(describe(summary), file=self.out)
        return summary

    # --- helpers -------------------------------------------------------------------------

    def _summary(self, plan, exit_codes: dict[str, int | None], **how) -> RunSummary:
        return RunSummary(run_id=self.spec.run_id, mode=self.spec.mode, nodes=self.spec.nodes,
                          world_size=plan.world_size, exit_codes=exit_codes,
                          wall_seconds=round(time.monotonic() - self._start, 2), log_dir=str(self.run_dir),
                          phases=self.phases.seconds, links=self.links, **how)

    def _resumed_from(self, logs: list) -> dict | None:
        """The RESUMED report in whichever node log holds rank 0's lines (the head's, unless it was lost)."""
        for path in logs:
            report = parse_resumed(path.read_text(errors="replace").splitlines()) if path.exists() else None
            if report is not None:
                return report
        return None

    def save(self, summary: RunSummary) -> None:
        """``summary.json``: written here (and again by a recovery that adds its timeline), nowhere else."""
        self.summary = summary
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
