"""What watches an attempt's job beside its parts, and the policy the loop asks before it starts a node's part
again (:mod:`multinode.app.watch` takes their events and answers).

* :class:`GoneWatch` -- every :data:`GONE_POLL` s on a thread, which of the job's nodes the provider says are gone
  (a deleted namespace, a terminated instance: a vanished machine ends no SSH session), each one a
  :class:`~multinode.core.events.NodeGone`, once; a question that fails is "cannot tell";
* :class:`Rejoin` -- MAX_RESTARTS: which nodes may be started again, how often, how long a lost one has to answer;
* :func:`confirm_lost` -- a recovering run replaces only what is lost indeed: the attempt's lost nodes asked over
  SSH once more, each on a new connection (but for a machine gone, or a node whose ranks are frozen: :func:`frozen`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from multinode.backends.base import RunContext
from multinode.checks.preflight import probe_ssh
from multinode.core.events import Events, NodeEnded, NodeGone
from multinode.diagnose.rank import root_cause

# How often a running job asks whether a node's machine is gone (a vanished machine ends no SSH session). EC2: a
# DescribeInstances, 2.5 % of a non-mutating action's 20/s refill (docs.aws.amazon.com/ec2/latest/devguide/).
GONE_POLL = 2.0
# A node is lost when it answers neither SSH probe: the first short, the second for a node merely busy (with the
# host's load average near 14 on 2 cores, node-0 and node-1 missed a 5 s probe right after a coordinated
# checkpoint and were replaced, their snapshots wiped: tests/integration/test_growback_local.py, 2026-11-24).
PROBE_SECONDS = (5.0, 20.0)


@dataclass(frozen=True)
class Rejoin:
    """MAX_RESTARTS: which nodes may be started again, how often, how long a lost one has to answer again."""

    budget: int  # relaunches allowed per node
    wait: float
    prepare: Callable[[str], None]  # e.g. sync the code again (a replaced node has none)
    exclude: tuple[str, ...] = ()  # nodes whose loss ends the job (the head: it hosts the rendezvous)

    def allows(self, event: NodeEnded, relaunches: int) -> bool:
        """Whether ``event``'s node may be started again: it is lost or was killed by a signal, its relaunch has
        not already failed, it is not excluded and it has relaunches left."""
        return event.killed and not event.final and event.node not in self.exclude and relaunches < self.budget


class GoneWatch:
    """Which of the job's nodes the provider says are gone (``ask``), every :data:`GONE_POLL` s (module doc)."""

    def __init__(self, ask: Callable[[list[str]], dict[str, str]], names: list[str], events: Events) -> None:
        self.ask, self.names, self.events = ask, list(names), events
        self.gone: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mn-gone-watch", daemon=True)

    def start(self) -> "GoneWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(GONE_POLL):
            for name, why in self.ask([n for n in self.names if n not in self.gone]).items():
                self.gone[name] = why
                self.events.put(NodeGone(name, why))


def confirm_lost(ctx: RunContext, suspects: list[str], gone: dict[str, str]) -> dict[str, str]:
    """{node: why} of ``suspects`` (a failed attempt's lost nodes) that are lost indeed: lost for sure (``gone``: the
    provider's word, or ranks found frozen), or neither SSH probe (:data:`PROBE_SECONDS`) answered, each on a new connection (the run's may be
    stale). A node busy enough to miss the first probe is not lost: replacing it would wipe its snapshots."""
    rest = [name for name in suspects if name not in gone]
    first = probe_ssh(ctx.inv.only(rest), timeout=PROBE_SECONDS[0]) if rest else {}
    doubt = [name for name, (ok, _why) in first.items() if not ok]
    again = probe_ssh(ctx.inv.only(doubt), timeout=PROBE_SECONDS[1]) if doubt else {}
    lost = {**{n: gone[n] for n in suspects if n in gone}, **{n: why for n, (ok, why) in again.items() if not ok}}
    return {n.name: lost[n.name] for n in ctx.inv.nodes if n.name in lost}


FROZEN = ("is stopped", "is in uninterruptible")  # a rank the stacks show so (multinode.diagnose.rank) is lost


def frozen(captured, head: str) -> tuple[str, str] | None:
    """(node, why) of the rank the live ranks' stacks (``captured``) show stopped or stuck in the kernel -- its node
    is lost as surely as a vanished one, whatever SSH says -- or None (the head's: its loss is the run's failure)."""
    culprit = root_cause(getattr(captured, "dumps", ()) or ())
    if culprit is None or culprit.node == head or not culprit.why.startswith(FROZEN):
        return None
    return culprit.node, f"its rank {culprit.rank} {culprit.why.split(';')[0]}"

