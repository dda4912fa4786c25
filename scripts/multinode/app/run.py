"""One ``make train``: the run as one object with named phases, the same for every backend and every outcome.

    plan -> claim -> [ pre-flight -> prepare -> launch -> watch -> sweep -> summarize -> (recover) ]* -> report

:meth:`Run.execute` is the template (torch elastic's ``SimpleElasticAgent._invoke_run`` is the model: attempts in a
loop, each ending in a typed outcome); each phase is a method, and what differs between backends -- how the job is
planned and shown, how it starts, is watched, is given a notice and stops, and what of its nodes the run can see --
is the backend's (:mod:`multinode.backends`). The runtime (host or container) is one object bound to the inventory
and run id (:mod:`multinode.plan.runtime`).

1. **plan** (pure; ``--dry-run`` stops here and prints it): the job against the cluster (NODES, GPUs), the entry
   point (our trainer or the user's project) and the backend's plan;
2. **claim**: the cluster is this run's until the run ends, every attempt included (:mod:`multinode.backends.claim`):
   a run in progress refuses this one in one line (or, queued, this one waits); the connections to the nodes are
   opened once, with the run's stop policy (GRACE), and held as long;
3. per attempt -- **pre-flight**, every node in parallel: SSH, the runtime's checks, the MPI SSH mesh, the
   rendezvous port, and in the same round the software probe (skew) and what each node holds of the code; then
   the buckets (DATA, CHECKPOINT_URL: :mod:`multinode.code.bucketcheck`), the link check and the GPU smoke test.
   A refused first attempt has started nothing and leaves no run directory;
   **prepare**: one incremental sync of the code, SETUP, the -m module check, DATA mirrored by every node
   (:mod:`multinode.code.data`), the run directory, the plan's files, the ENV files, the MPI credentials;
   **launch** and **watch**: the backend's, with the stall watchdog and, on fewer nodes than asked, the grow-back
   (:mod:`multinode.app.growback`); a failure, stall or deadline first lets the run look at the live ranks; **sweep**: every process tagged with the run id (and the runtime's containers)
   stopped, however the job ended; **summarize**: the backend's :class:`~multinode.core.outcome.Outcome` made a
   :class:`~multinode.diagnose.summary.RunSummary` (the root cause of a failure from the ranks alive at failure
   time and the nodes' logs) and saved -- ``summary.json`` is written here and nowhere else;
4. **recover** (RECOVER=N, :mod:`multinode.app.recover`): from the outcome, the nodes the next attempt runs on
   (a node replaced, fewer nodes, or the whole cluster again), or the end of the run;
5. **report**: the last summary printed (a failure's to stderr), its exit code the run's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import TextIO

from multinode.app import ending
from multinode.app.attempt import Attempt
from multinode.app.members import Members
from multinode.app.recover import Recovery
from multinode.app.watch import AttemptLoop
from multinode.app.watchers import Rejoin, confirm_lost
from multinode.backends import backend_for
from multinode.backends.base import Claim, JobPlan, RunContext
from multinode.checks.gpu import gpu_smoke
from multinode.checks.preflight import preflight, start_mpi_sshds
from multinode.checks.software import check_code
from multinode.code.bucketcheck import check_buckets
from multinode.code.credentials import sync_mpi_credentials
from multinode.code.data import sync_data
from multinode.code.prepare import prepare_project, remove_env_files, write_env_files
from multinode.code.project import ResolvedProject, resolve_entry
from multinode.code.sync import read_manifest
from multinode.core.config import LaunchSpec
from multinode.core.errors import MultinodeError, NodeError
from multinode.core.inventory import Inventory
from multinode.core.outcome import Outcome
from multinode.core.state import ClusterState
from multinode.diagnose.ledger import JobMarks, account
from multinode.diagnose.slowranks import SlowRanks
from multinode.diagnose.summary import Phases, RunSummary
from multinode.plan.request import check_gpu_request
from multinode.plan.runtime import runtime_for
from multinode.providers import get_provider




class Run:
    """One job on one cluster, from plan to report, over as many attempts as recovery allows (module doc)."""

    def __init__(self, state: ClusterState, inventory: Inventory, spec: LaunchSpec, out: TextIO | None = None,
                 err: TextIO | None = None, provider=None):
        self.state, self.spec, self.cluster = state, spec, inventory
        self.provider = provider or get_provider(inventory.provider)
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.run_dir = state.run_dir(spec.run_id)
        self.phases = Phases()
        self.code: ResolvedProject | None = None
        self.recovery = Recovery(state, inventory, spec, self.say, self.provider) if spec.recover and not spec.dry_run \
            else None
        self._start = self.phases.began
        self.jobs: list[JobMarks] = []  # each attempt's job marks, for the ledger

    def say(self, message: str) -> None:
        print(f"[recover] {message}", file=self.out, flush=True)

    # --- the template ------------------------------------------------------------------

    def execute(self) -> RunSummary | None:
        """The run, start to end; its last summary (None for a dry run). How the job ended is the summary's
        ``outcome`` and ``exit_code``; a request that cannot run raises a UserError before anything starts."""
        attempt = self.plan(self.cluster, self.spec, number=0)
        if self.spec.dry_run:
            print(attempt.backend.describe(attempt.ctx, attempt.plan), file=self.out)
            return None
        with attempt.backend.reach.hold(attempt.ctx) as claim:  # connections and claim, given back however it ends
            self.phases.mark("claim")
            try:
                summary = self.attempts(attempt, claim)
            finally:
                if self.recovery is not None:  # the cluster stays whole: a replacement under way is let finish
                    self.recovery.replacements.finish(self.recovery.say)
        ending.report(summary, self.out, self.err, self.recovery.timeline.lines() if summary.recovery else [])
        return summary

    def attempts(self, attempt: Attempt, claim: Claim) -> RunSummary:
        """Attempt after attempt until one ends the run (only one without RECOVER); the last one's summary."""
        while True:
            outcome = self.attempt(attempt)
            summary = ending.summarize(attempt, outcome, self.phases, self._start)
            following = self.recovery.after(attempt.ctx, outcome, summary, attempt.started_at,
                                            ending.resumed_report(attempt, outcome)) if self.recovery else None
            if self.recovery is not None and self.recovery.recovered:
                summary = replace(summary, recovery=self.recovery.record())
            summary = self.account(attempt, outcome, summary, following is not None)
            ending.save(self.run_dir, summary)
            if following is None:
                return summary
            self.recovery.keep_attempt(self.run_dir)
            attempt = self.next_attempt(attempt, following, claim)
            self.phases.mark("recover")
            self.phases.attempt = attempt.number

    def account(self, attempt: Attempt, outcome: Outcome, summary: RunSummary, recovering: bool) -> RunSummary:
        """The summary with the ledger of the run so far (:mod:`multinode.diagnose.ledger`): this attempt's job
        marks added to the earlier attempts' (and, when it is recovered from, the highest step it reached)."""
        loss = self.recovery.pending if recovering and self.recovery is not None else None
        if attempt.started_at is not None:
            self.jobs.append(ending.job_marks(attempt, outcome, loss.last_step if loss else None))
        return replace(summary, ledger=account(self.phases.spans, self.jobs, summary.wall_seconds,
                                               self.phases.began_unix))

    def attempt(self, attempt: Attempt) -> Outcome:
        """pre-flight -> prepare -> launch -> watch -> sweep. A later attempt that cannot start is a failed
        outcome (the recovery's timeline is kept); the first one's refusal is the user's one line."""
        try:
            attempt.plan = self.prepare(attempt, self.preflight(attempt))
        except MultinodeError as err:
            if attempt.number == 0:
                raise
            failure = NodeError(attempt.ctx.inv.head.name, "pre-flight", None, f"could not start again: {err}")
            return Outcome("failed", {n.name: None for n in attempt.ctx.inv.nodes}, failure=failure,
                           failures=(failure,))
        try:
            self.launch(attempt)
            return self.watch(attempt)
        finally:
            self.sweep(attempt)

    # --- phases --------------------------------------------------------------------------

    def plan(self, inventory: Inventory, spec: LaunchSpec, number: int) -> Attempt:
        """The job checked against the nodes and planned; nothing runs, nothing is written."""
        backend = backend_for(inventory, spec)
        inv = backend.nodes(inventory)
        check_gpu_request(inv, spec)
        self.code = self.code or resolve_entry(spec)
        ctx = RunContext(spec=spec, inv=inv, runtime=runtime_for(inv, spec.run_id), code=self.code,
                         run_dir=self.run_dir, out=self.out)
        return Attempt(number, spec, backend, ctx, backend.plan(ctx, self.code.entry))

    def preflight(self, attempt: Attempt) -> dict[str, str]:
        """Every node can run the job (PreflightFailed, one line, otherwise); the nodes' code manifests."""
        ctx, reach = attempt.ctx, attempt.backend.reach
        versions = reach.software_probes(ctx)
        reads = {"versions": versions} if versions else {}
        reads["manifest"] = {n.name: read_manifest(ctx.inv, n.name, self.code.subdir) for n in ctx.inv.nodes}
        answers = preflight(ctx.runner, checks=ctx.runtime.checks(),
                            need_mpi_ssh=attempt.backend.needs_mpi_ssh(ctx.spec) and ctx.runtime.mpi_peers_are_nodes,
                            port=attempt.backend.rendezvous_port(ctx.spec), timeout=ctx.spec.preflight_timeout,
                            reads=reads)
        reach.check_software(ctx, answers.get("versions"))
        check_buckets(ctx.runner, ctx.spec)  # DATA and CHECKPOINT_URL usable from every node
        self.phases.mark("pre-flight")
        attempt.links = reach.link_check(ctx, ctx.spec.linkcheck)
        if attempt.links is not None:
            self.phases.mark("link check")
        if ctx.spec.uses_gpu:
            gpu_smoke(ctx.runner, ctx.inv, ctx.spec)
            self.phases.mark("GPU smoke test")
        return answers["manifest"]

    def prepare(self, attempt: Attempt, manifests: dict[str, str]) -> JobPlan:
        """Code, SETUP and the module ready on every node, then the run directory and the job's files."""
        ctx, backend = attempt.ctx, attempt.backend
        # Before the run directory exists: a refused job leaves no trace (the nodes keep what was synced).
        prepare_project(ctx.runner, ctx.spec, self.code, self.out, manifests=manifests)
        if self.code.ours:  # every node holds exactly the files the sync sent (a project is vouched for by its manifest)
            tree = self.code.project
            check_code(ctx.runner, [(tree.root / rel, f"{self.code.subdir}/{rel}") for rel in tree.manifest.files],
                       ctx.spec.skew)
        plan = backend.finish_plan(ctx, attempt.plan)
        self.phases.mark("sync")
        if ctx.spec.data:  # DATA mirrored by every node into its DATA_DIR
            sync_data(ctx.runner, ctx.spec, self.out)
            self.phases.mark("data")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        backend.record(ctx, plan)
        if ctx.spec.uses_mpi:
            sync_mpi_credentials(ctx.runner)
        backend.write_files(ctx, plan)
        return plan

    def launch(self, attempt: Attempt) -> None:
        """What must be in place the moment the job starts (inside the sweep's reach): the ENV files and the
        runtime's MPI sshds."""
        ctx = attempt.ctx
        write_env_files(ctx.runner, ctx.spec)
        Members.of(ctx, attempt.plan, ctx.runner.say).clear()  # no node keeps an earlier attempt's membership
        if ctx.spec.uses_mpi and not ctx.runtime.mpi_peers_are_nodes:
            start_mpi_sshds(ctx.runner, ctx.spec.run_id)
        self.phases.mark("start")
        attempt.started_at = time.time()

    def watch(self, attempt: Attempt) -> Outcome:
        """The job started and watched until it ends by the attempt's loop (:mod:`multinode.app.watch`): the
        decisions while it runs are the loop's -- with the run's look at the live ranks before a failure's stop, the
        provider's word on vanished machines, the stall watchdog, MAX_RESTARTS' rejoin and, on fewer nodes than
        the cluster has, growing back."""
        ctx, spec = attempt.ctx, attempt.ctx.spec
        attempt.slow = SlowRanks(ctx.runner.say)
        rejoin = Rejoin(spec.max_restarts, spec.rdzv_timeout, lambda node: self.prepare_again(attempt, node),
                        exclude=(ctx.inv.head.name,)) if spec.max_restarts else None
        loop = AttemptLoop(ctx, attempt.backend, attempt.plan, gone=self.gone, slow=attempt.slow,
                           capture=lambda failure, lost: self.capture(attempt, failure, lost),
                           watchdog=attempt.backend.reach.watchdog(ctx), rejoin=rejoin,
                           grow=self.recovery.grow_back(ctx) if self.recovery else None,
                           confirm=confirm_lost if self.recovery else None, recovery=self.recovery,
                           prepare=lambda node: self.prepare_again(attempt, node))
        try:
            return loop.run()
        finally:
            attempt.gone = dict(loop.gone)
            self.phases.mark("job")

    def gone(self, names: list[str]) -> dict[str, str]:
        """{node: why} of ``names`` whose machine the provider says is gone; {} when it cannot tell (an API error
        is "cannot tell": every node is then treated as possibly there)."""
        try:
            return self.provider.gone(self.state, self.cluster_now(), names) if names else {}
        except Exception as err:  # noqa: BLE001 -- a question to a cloud API: any failure means "cannot tell"
            print(f"[multinode] could not ask which nodes are gone: {err}", file=self.err, flush=True)
            return {}

    def cluster_now(self) -> Inventory:
        """The cluster as the provider last wrote it (a replacement changes it)."""
        return self.recovery.cluster if self.recovery is not None else self.cluster

    def capture(self, attempt: Attempt, failure: NodeError, lost: tuple[str, ...]):
        """The backend's look at the live ranks before it stops a failed job (or names a frozen node); the capture."""
        attempt.captured = attempt.backend.reach.capture(attempt.ctx, failure, lost)
        return attempt.captured

    def prepare_again(self, attempt: Attempt, node: str) -> None:
        """A node that comes back (rebooted or replaced) gets the code, the job's files and the ENV file again."""
        ctx = attempt.ctx
        prepare_project(ctx.runner, ctx.spec, self.code, self.out, names=[node])
        if ctx.spec.data:
            sync_data(ctx.runner, ctx.spec, self.out, names=[node])
        write_env_files(ctx.runner, ctx.spec, names=[node])
        attempt.backend.write_files(ctx, attempt.plan, names=[node])

    def sweep(self, attempt: Attempt) -> None:
        """Stop anything still tagged with the run id on every node (and the runtime's containers), even after
        success; remove the ENV files."""
        ctx = attempt.ctx
        names = [n.name for n in ctx.inv.nodes if n.name not in attempt.gone]  # a vanished node: nothing to stop
        if names:
            ctx.runner.stop_all(ctx.spec.run_id, extra_stop=ctx.runtime.stop_line, names=names)
            remove_env_files(ctx.runner, ctx.spec, names=names)
        self.phases.mark("sweep")

    # --- between attempts --------------------------------------------------------------

    def next_attempt(self, previous: Attempt, inventory: Inventory, claim: Claim) -> Attempt:
        """The next attempt on ``inventory``: planned again for its node count, the connections moved to its nodes
        (kept where a node did not change), and the claim taken again where the head was replaced."""
        runner = previous.ctx.runner
        head = runner.inventory.head
        attempt = self.plan(inventory, replace(self.spec, nodes=len(inventory.nodes)), previous.number + 1)
        runner.retarget(attempt.ctx.inv)
        attempt.ctx.runner = runner
        if attempt.ctx.inv.head.name == head.name and attempt.ctx.inv.head != head:
            claim.take()  # the head is a new machine: the claim lived on the one it replaced
        return attempt
