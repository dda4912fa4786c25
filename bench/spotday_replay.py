"""The spot day's cloud: a trace's events (``bench.spotday_trace``) applied to one local cluster at their times.

:class:`Cloud` runs on a thread of its own from the moment a method's first ``train`` starts (``t0``), for every
method the same, and does what the cloud would do, through the local provider's fault knobs:

* ``notice``: the node's metadata endpoint serves a spot interruption notice (``imds.arm_notice``: what
  ``training/imds.py`` polls on EC2); the instance is taken :data:`~bench.spotday_trace.NOTICE_LEAD` s later
  unless it is gone by then (a method that gave it back after its checkpoint);
* ``lost``: the instance vanishes (``faults.lose_node``: every process killed, its namespace gone; where the cloud
  itself brings nodes back, every process killed and its link cut, :meth:`Cloud._crash`);
* ``rebalance``: the endpoint serves a rebalance recommendation;
* ``no_capacity``: replacements are refused for its seconds (``faults.refuse_replacements``; :meth:`Cloud.capacity`
  for a method that makes its cluster again itself);
* ``slow``: the job's processes on the node (those of the run id: ``MULTINODE_RUN_ID`` in their environment) held
  to its CPU share for its seconds (``cpuquota.throttled``), with their children. Not held: the node's sshd and
  the orchestrator's shells on it, and so a job started again there meanwhile -- at 0.03 of a core its ranks did not
  reach the process group within its timeout (30 s, 10 s), and ``ours`` ended there in the second and third full
  replays (the restart "failed with every node answering", which recovery does not retry): a finding, not what the
  replay measures.

An event on a node that has no instance at that moment (taken, or its cluster being made again) is skipped and
recorded as such. Who replaces a taken instance is the method's (``replaces``, :data:`REPLACERS`); each
replacement takes the event's ``replacement`` seconds: the orchestrator's (``RECOVER``) in the local provider,
which sleeps it (``faults.set_replace_delay``, set at the event); the cloud's, after that time, retrying every
:data:`RETRY` s while capacity is refused (an autoscaling group: torchrun's baseline, whose nodes come back by
themselves); or the method's own, which makes its whole cluster again (:meth:`Cloud.wait_capacity`).

The cloud's new instance keeps the node's namespace, name, address and host key, its work directory emptied as a
new instance's: MAX_RESTARTS' rejoin waits for a node that answers SSH again, and neither takes a node the provider
calls gone (the job fails at once) nor reads a replaced node's new host key (the rejoin is refused) -- two
limits of the orchestrator's rejoin that a real autoscaling group's node, which starts torchrun itself, does not
meet. Nothing here reads what a method does; :mod:`bench.spotday_watch` watches it.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable

from bench.drills.common import environ
from bench.nodes import LocalCluster
from bench.spotday_trace import Event, Trace
from bench.spotday_watch import Watch

# SkyPilot's managed jobs retry a launch that found no capacity after RETRY_INIT_GAP_SECONDS = 60 (sky/jobs/
# recovery_strategy.py, StrategyExecutor); the replays retry every replacement that often.
RETRY = 60.0
REPLACERS = ("orchestrator", "cloud", "method")


def in_order(events) -> list[Event]:
    """The events by time; at the same second a shortage first: a node lost in it finds no capacity for its
    replacement. Applied after the loss (the trace's own order), it left a gap an orchestrator's ask could pass
    through: ``ours`` on 1684a22 had its node-3 back 142 s after the loss at +735 s, in the 226 s the trace refuses
    replacements (2026-12-07), where the same trace's replay on the next commit was refused as the trace says."""
    return sorted(events, key=lambda e: (e.at, e.kind != "no_capacity"))


class Cloud:
    """The trace's events on ``cluster`` from ``t0`` (monotonic) on (module doc)."""

    def __init__(self, cluster: LocalCluster, trace: Trace, watch: Watch, t0: float, *, replaces: str, run_id: str,
                 say: Callable[[str], None] = print) -> None:
        from multinode.core.state import ClusterState

        if replaces not in REPLACERS:
            raise ValueError(f"replaces={replaces!r}: one of {', '.join(REPLACERS)}")
        self.cluster, self.trace, self.watch, self.t0 = cluster, trace, watch, t0
        self.state = ClusterState.for_cluster(cluster.name, root=cluster.home)
        self.replaces, self.run_id, self.say = replaces, run_id, say
        self.refused_until = 0.0  # monotonic
        self.applied: list[dict] = []  # {"at", "kind", "node", "what"}, seconds since t0
        self.last_replacement: float | None = None  # the latest taken instance's replacement seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- the clock -------------------------------------------------------------------

    def start(self) -> "Cloud":
        self._spawn(self._run, "spotday-cloud")
        return self

    def stop(self) -> None:
        """No event after this; the throttles end, replacements are allowed again."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self._refuse(False)

    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        for event in in_order(self.trace.events):
            if self._stop.wait(max(0.0, self.t0 + event.at - time.monotonic())):
                return
            try:
                self._apply(event)
            except Exception as err:  # an event that finds the node half gone is recorded, the replay goes on
                self._record(event, f"failed: {type(err).__name__}: {err}", "failed")

    def _record(self, event: Event, what: str, effect: str | None = None) -> None:
        """The event applied (``effect`` None: at its time, with its ``seconds``) or a later effect of it (a noticed
        instance taken, a new instance, a refusal, capacity back)."""
        at = round(time.monotonic() - self.t0, 1)
        row = {"at": at, "kind": event.kind, "node": event.node, "what": what}
        row.update({"effect": effect} if effect else {"seconds": event.seconds} if event.seconds else {})
        self.applied.append(row)
        self.say(f"spotday +{at:.0f} s: {event.kind}{'' if event.node is None else f' node-{event.node}'}: {what}")

    # --- the events ------------------------------------------------------------------

    def _apply(self, event: Event) -> None:
        if event.kind == "no_capacity":
            self.refused_until = time.monotonic() + event.seconds
            self._refuse(True)
            self._spawn(self._capacity_back, "spotday-capacity", event)
            self._record(event, f"replacements refused for {event.seconds:g} s")
            return
        name = f"node-{event.node}"
        ident = self.watch.instances.ident(event.node)
        if ident is None:
            self._record(event, "skipped: no instance", "skipped")
            return
        from multinode.providers.local import faults, imds

        if event.kind in ("notice", "lost") and self.replaces == "orchestrator":
            faults.set_replace_delay(self.state, event.replacement)  # the orchestrator's replace sleeps it
            self.watch.instances.booting[event.node] = event.replacement
        if event.kind == "notice":
            imds.arm_notice(self.state, name, 0.0)
            self._spawn(self._reclaim, f"spotday-reclaim-{name}", event, ident)
            self._record(event, f"notice served; taken in {event.seconds:g} s")
        elif event.kind == "rebalance":
            imds.arm_notice(self.state, name, 0.0, kind="rebalance")
            self._record(event, "rebalance recommendation served")
        elif event.kind == "lost":
            self._take(event)
            self._record(event, "taken without notice")
        else:
            self._spawn(self._slow, f"spotday-slow-{name}", event)
            self._record(event, f"held to {event.share:g} of a core for {event.seconds:g} s")

    def _reclaim(self, event: Event, ident: tuple[int, int]) -> None:
        if self._stop.wait(event.seconds):
            return
        if self.watch.instances.ident(event.node) != ident:
            self._record(event, "the noticed instance was already gone when its time came", "already gone")
            return
        self._take(event)
        self._record(event, "the noticed instance taken", "taken")

    def _take(self, event: Event) -> None:
        from multinode.providers.local import faults

        self.watch.poll()  # the head's last sample lines, before its files go
        self.last_replacement = event.replacement
        if self.replaces == "cloud":
            self._crash(event.node)
            self._spawn(self._replace, f"spotday-replace-{event.node}", event)
        else:
            faults.lose_node(self.state, f"node-{event.node}")
        self.watch.poll()

    def _crash(self, node: int) -> None:
        """The instance gone, its namespace kept for the next one (module doc): every process killed, its link cut."""
        import os
        import signal

        from multinode.providers.local import faults

        name = f"node-{node}"
        faults.set_link(self.state, name, up=False)
        for pid in faults.node_pids(self.state, name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.watch.instances.take(node)

    def _replace(self, event: Event) -> None:
        """An autoscaling group's new instance for a taken one: asked at once (and every RETRY s while capacity is
        refused), ready after its launch time, in the taken one's namespace with an empty work directory."""
        from multinode.providers.local import faults
        from multinode.providers.local.sshd import start_sshd

        while not self.capacity():  # asked at once, and again every RETRY s while refused; then launched
            self._record(event, f"replacement refused; again in {RETRY:g} s", "refused")
            if self._stop.wait(RETRY):
                return
        if self._stop.wait(event.replacement):
            return
        name = f"node-{event.node}"
        shutil.rmtree(self.cluster.workdir(event.node), ignore_errors=True)
        faults.set_link(self.state, name, up=True)
        start_sshd(self.state, name)
        self.watch.instances.back(event.node, event.replacement)
        self._record(event, f"a new instance after {event.replacement:g} s", "new instance")

    def _slow(self, event: Event) -> None:
        from multinode.providers.local.cpuquota import throttled

        tag = f"MULTINODE_RUN_ID={self.run_id}".encode()
        try:
            with throttled(self.state, f"node-{event.node}", event.share,
                           pick=lambda pid: tag in environ(pid)) as held:
                self._record(event, f"{len(held)} process(es) of the job held", "held")
                self._stop.wait(event.seconds)
        except OSError as err:  # the node taken meanwhile
            self._record(event, f"throttle ended early: {err}", "throttle ended")

    def _capacity_back(self, event: Event) -> None:
        self._stop.wait(event.seconds)
        self._refuse(False)
        if not self._stop.is_set():
            self._record(event, "replacements allowed again", "capacity back")

    def _refuse(self, refuse: bool) -> None:
        from multinode.providers.local import faults

        if not self.state.provider_dir.exists():  # the cluster is being made again: capacity() holds the state
            return
        (faults.refuse_replacements if refuse else faults.allow_replacements)(self.state)

    # --- for a method that makes its cluster again itself -----------------------------

    def capacity(self) -> bool:
        return time.monotonic() >= self.refused_until

    def wait_capacity(self) -> float:
        """Until capacity is back, asking every RETRY s (as SkyPilot's relaunch does); the seconds waited."""
        start = time.monotonic()
        while not self.capacity() and not self._stop.is_set():
            self._stop.wait(RETRY)
        return time.monotonic() - start
