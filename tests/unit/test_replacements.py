"""Wait or shrink, and replacements under way (multinode.app.replacements), without a cluster: a fake provider's
replace on the real threads; the local provider's MULTINODE_REPLACE_DELAY read and refused in one line. The real
drill: tests/integration/test_replace_delay_local.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from multinode.app.recover import Loss, Recovery
from multinode.app.replacements import Replacements, wait_seconds
from multinode.core.config import LaunchSpec
from multinode.core.errors import CapacityRefused, UserError
from multinode.core.events import Events, ReplacementReady
from multinode.core.state import ClusterState
from multinode.providers.base import Estimate
from multinode.providers.local.faults import replace_delay


def test_wait_only_when_the_replacement_comes_sooner_than_a_restart():
    assert wait_seconds(None, 8.0, 120.0) == 120.0  # the provider cannot say (EC2): up to RECOVER_WAIT
    assert wait_seconds(1.0, None, 120.0) == 120.0  # no restart measured yet
    assert wait_seconds(1.0, 8.0, 120.0) == 120.0  # sooner than a restart: wait for it
    assert wait_seconds(120.0, 8.0, 120.0) == 0.0  # later: go on at once, grow back when it is ready


def test_replace_delay_is_seconds_or_one_line():
    assert replace_delay({}) == 0.0 and replace_delay({"MULTINODE_REPLACE_DELAY": "120"}) == 120.0
    for bad in ("soon", "-5", "nan"):
        with pytest.raises(UserError, match=r"MULTINODE_REPLACE_DELAY=.* must be 0 or more seconds .* e\.g\. "
                                            r"MULTINODE_REPLACE_DELAY=120"):
            replace_delay({"MULTINODE_REPLACE_DELAY": bad})


class Slow:
    """A provider whose replacement is made when the test releases it; counts the asks."""

    def __init__(self, estimate):
        self.estimate, self.asked, self.release = estimate, [], threading.Event()

    def replacement_estimate(self, state, inventory):
        return Estimate(self.estimate, "told by the test")

    def replace(self, state, inventory, name, retire=None):
        self.asked.append(name)
        if not self.release.wait(30):
            raise CapacityRefused("never released")
        return inventory


def test_a_replacement_under_way_is_taken_when_ready_and_never_asked_twice():
    made = threading.Event()
    calls = []

    def replace(name, retire=None):
        calls.append(name)
        made.wait(30)
        return "inventory"

    under_way = Replacements(replace)
    under_way.ask("node-2")
    assert under_way.wait("node-2", 0.0) is None  # still under way
    under_way.ask("node-2")  # not asked twice
    made.set()
    done = under_way.wait("node-2", 30)
    assert done.inventory == "inventory" and done.refused is None and done.at is not None and calls == ["node-2"]


def test_any_error_of_a_replacement_is_a_refusal_in_one_line_and_never_a_dead_thread():
    """boto3's own errors (throttling after its retries, a waiter giving up) are not MultinodeErrors: the thread
    used to die with an empty result box, and the run's wait raised KeyError."""

    def replace(name, retire=None):
        raise RuntimeError("Waiter InstanceRunning failed: Max attempts exceeded")

    replacements = Replacements(replace)
    replacements.ask("node-1")
    done = replacements.wait("node-1", 30)
    assert done.inventory is None
    assert done.refused == "the replacement failed: RuntimeError: Waiter InstanceRunning failed: Max attempts exceeded"


def test_a_replacement_done_between_attempts_reports_to_the_next_attempts_loop():
    done = threading.Event()
    replacements = Replacements(lambda name, retire=None: done.set() or "inventory")
    events = Events()
    replacements.ask("node-1")
    done.wait(30)
    replacements.listen(events)  # done before anybody listened, or just after: it reports here either way
    ready = events.take(5)
    assert isinstance(ready, ReplacementReady) and ready.node == "node-1" and ready.inventory == "inventory"


def test_a_slow_replacement_goes_on_without_the_node_at_once_then_grows_back(tmp_path):
    provider = Slow(estimate=120.0)
    spec = LaunchSpec(nodes=3, recover=1, recover_wait=300, grace=30)
    said: list[str] = []
    rec = Recovery(ClusterState.for_cluster("dev", root=tmp_path), make_inventory(3), spec, said.append,
                   provider=provider)
    rec.restart_seconds = 8.0
    active = rec._replace_or_shrink(rec.cluster, Loss(["node-2"], "notice", 7), 0.0)  # no 300 s wait
    assert [n.name for n in active.nodes] == ["node-0", "node-1"]
    assert [e["event"] for e in rec.timeline.events] == ["replacement asked", "going on without it"]
    assert ("it takes about 120 s (told by the test), longer than a restart of the job, about 8 s: going on without "
            "it at once") in "\n".join(said)
    grow = rec.grow_back(SimpleNamespace(inv=active))  # the next attempt's loop
    events = Events()
    grow.begin(events)
    provider.release.set()
    ready = events.take(30)  # growing back takes the replacement under way; it asks no second one
    grow.take(ready)
    assert grow.ready and provider.asked == ["node-2"] and rec.timeline.events[-1]["event"] == "node back"
    assert said[-2:] == ["node-2 is back",
                         "every node is back: the ranks take a checkpoint and the run resumes on the whole cluster"]


def test_a_bad_replace_delay_stops_a_recovering_run_before_it_starts(tmp_path, monkeypatch):
    from multinode.app.run import Run
    from multinode.providers.local.provider import LocalProvider

    monkeypatch.setenv("MULTINODE_REPLACE_DELAY", "two minutes")
    state = ClusterState.for_cluster("dev", root=tmp_path)
    with pytest.raises(UserError, match="MULTINODE_REPLACE_DELAY='two minutes' must be 0 or more seconds"):
        Run(state, make_inventory(3), LaunchSpec(nodes=3, recover=1), provider=LocalProvider())
    assert not any(tmp_path.iterdir())  # nothing written
