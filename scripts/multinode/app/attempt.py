"""One attempt of a run (:class:`multinode.app.run.Run`): the job started once on one set of nodes -- its spec,
backend, context and plan, and what the run learned while it ran. A run has one, or (RECOVER) several in turn."""

from __future__ import annotations

from dataclasses import dataclass, field

from multinode.backends.base import Backend, JobPlan, RunContext
from multinode.core.config import LaunchSpec
from multinode.diagnose.capture import Capture
from multinode.diagnose.slowranks import SlowRanks


@dataclass
class Attempt:
    """One start of the job on one set of nodes: its spec, backend, context and plan, and what it left behind."""

    number: int  # 0 for the first
    spec: LaunchSpec
    backend: Backend
    ctx: RunContext
    plan: JobPlan
    started_at: float | None = None  # Unix time the job was launched
    captured: Capture | None = None  # the live ranks' stacks before a failed job was stopped
    links: dict | None = None  # the link check's report (pre-flight, or after a broken connection)
    slow: SlowRanks | None = None  # the ranks' step times compared while the job trains (named slow ranks)
    gone: dict[str, str] = field(default_factory=dict)  # nodes whose machine the provider said is gone, and why
