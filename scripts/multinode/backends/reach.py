"""What the run sees of the job's nodes (:class:`~multinode.backends.base.Reach`), in two kinds:

* :class:`EveryNode` -- the run holds an SSH connection to every node of the job (the SSH backend; SLURM on nodes
  the run made or was given): it claims the cluster on its head (:mod:`multinode.backends.claim`), compares the
  nodes' software (:mod:`multinode.checks.software`), checks the links (:mod:`multinode.checks.links`), runs the
  stall watchdog, captures the live ranks' stacks before a failed job is stopped, and fetches rank 0's metrics;
* :class:`LoginNodeOnly` -- the run reaches only a scheduler's login node (``PROVIDER=hosts`` with a shared
  filesystem): none of that (the site's scheduler queues jobs and ends a failed one), said once at pre-flight.

The run's template asks its backend's reach; it never tests which kind it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from multinode.backends.base import RunContext
from multinode.backends.claim import Claim
from multinode.checks.links import link_check
from multinode.checks.software import check_versions, probe_cache, versions_probe
from multinode.core.errors import NodeError
from multinode.core.nodepaths import run_dir as node_run_dir
from multinode.diagnose.capture import Capture, capture
from multinode.diagnose.rank import own_failure
from multinode.diagnose.summary import fetch_metrics
from multinode.diagnose.watchdog import StallWatchdog
from multinode.ssh.runner import RemoteRunner, StopPolicy


class Holding:
    """The run's hold on what it reaches, the same for both kinds: its connections and the kind's claim."""

    @contextlib.contextmanager
    def hold(self, ctx: RunContext) -> Iterator[Claim]:
        """The run's connections opened (with its stop policy: GRACE) and set as ``ctx.runner``, then the kind's
        claim taken (:meth:`claim`); on exit the claim given back, then the connections closed, however the run
        ends. A claim refused (the cluster busy) leaves nothing open."""
        runner = RemoteRunner(ctx.inv, out=ctx.out, stop=StopPolicy(ctx.spec.grace))
        runner.prewarm()  # every node's login shell starts now, while the rest is prepared
        with runner:
            ctx.runner = runner
            claim = self.claim(ctx)
            claim.take()
            try:
                yield claim
            finally:
                claim.release()


class EveryNode(Holding):
    """The run reaches every node of the job over SSH (see the module doc)."""

    def claim(self, ctx: RunContext) -> Claim:
        return Claim(ctx.runner, ctx.spec.run_id, wait=ctx.spec.queue)  # QUEUE=1: wait instead of being refused

    def software_probes(self, ctx: RunContext) -> dict[str, str]:
        if not ctx.runtime.compares_software:
            return {}
        inv, mpi = ctx.inv, ctx.spec.uses_mpi
        return {n.name: versions_probe(inv.python, mpi, probe_cache(inv.workdir_for(n.name), inv.python, mpi))
                for n in inv.nodes}

    def check_software(self, ctx: RunContext, answers: dict[str, str] | None) -> None:
        if answers is not None:
            check_versions(ctx.inv, answers, ctx.spec.skew)

    def link_check(self, ctx: RunContext, mode: str, after_failure: bool = False) -> dict | None:
        """Every node's links to its ring neighbours, on ``RDZV_PORT + 1``."""
        if len(ctx.inv.nodes) < 2 or mode == "off":
            return None
        report = link_check(ctx.runner, ctx.inv, mode, ctx.spec.rdzv_port + 1)
        return {**report.to_json(), "after_failure": after_failure}

    def watchdog(self, ctx: RunContext) -> StallWatchdog | None:
        if not ctx.spec.stall_timeout:
            return None
        run_dirs = {n.name: node_run_dir(ctx.inv, n.name, ctx.spec.run_id) for n in ctx.inv.nodes}
        return StallWatchdog(ctx.runner, ctx.spec.run_id, ctx.run_dir, ctx.spec.stall_timeout, run_dirs)

    def capture(self, ctx: RunContext, failure: NodeError, lost: tuple[str, ...]) -> Capture:
        """One look suffices when a node crashed on its own (only a stopped or stuck-in-the-kernel rank outranks
        it); a second look, half a second later, tells a stuck rank from a passing one. A lost node is not asked
        (it would cost the 3 s channel timeout)."""
        crashed = failure.node in lost or (failure.returncode is not None and own_failure([failure]) is not None)
        names = [n.name for n in ctx.inv.nodes if n.name not in lost]
        found = capture(ctx.runner, ctx.spec.run_id, samples=1 if crashed else 2, names=names)
        ctx.runner.say(f"captured the stacks of {len(found.dumps)} live rank(s) in {found.seconds:.1f} s")
        return found

    def metrics(self, ctx: RunContext) -> str | None:
        return fetch_metrics(ctx.runner, ctx.inv, ctx.spec, ctx.run_dir)


class LoginNodeOnly(Holding):
    """The run reaches a scheduler's login node only (see the module doc)."""

    def __init__(self, unchecked: str) -> None:
        self.unchecked = unchecked  # what the run says it skipped

    def claim(self, ctx: RunContext) -> "NoClaim":
        return NoClaim()

    def software_probes(self, ctx: RunContext) -> dict[str, str]:
        return {}

    def check_software(self, ctx: RunContext, answers: dict[str, str] | None) -> None:
        if ctx.runtime.compares_software and len(ctx.inv.nodes) > 1:
            ctx.runner.say(self.unchecked)

    def link_check(self, ctx: RunContext, mode: str, after_failure: bool = False) -> dict | None:
        return None

    def watchdog(self, ctx: RunContext) -> StallWatchdog | None:
        return None

    def capture(self, ctx: RunContext, failure: NodeError, lost: tuple[str, ...]) -> Capture | None:
        return None

    def metrics(self, ctx: RunContext) -> str | None:
        return None


class NoClaim:
    """No claim: the site's scheduler queues jobs, and the login node is shared by its users."""

    def take(self) -> None:
        pass

    def release(self) -> None:
        pass
