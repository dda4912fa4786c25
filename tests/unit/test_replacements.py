"""Wait or shrink, and replacements under way (multinode.app.replacements), without a cluster: a fake provider's
replace on the real threads; the local provider's MULTINODE_REPLACE_DELAY read and refused in one line. The real
drill: tests/integration/test_replace_delay_local.py."""

from __future__ import annotations

import threading

import pytest
from conftest import make_inventory

from multinode.app.recover import Loss, Recovery
from multinode.app.replacements import Replacements, StillUnderWay, wait_seconds
from multinode.core.config import LaunchSpec
from multinode.core.errors import CapacityRefused, UserError
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

    def replace(self, state, inventory, name):
        self.asked.append(name)
        if not self.release.wait(30):
            raise CapacityRefused("never released")
        return inventory


def test_a_replacement_under_way_is_taken_when_ready_and_never_asked_twice():
    made = threading.Event()
    calls = []

    def replace(name):
        calls.append(name)
        made.wait(30)
        return "inventory"

    under_way = Replacements(replace)
    under_way.ask("node-2")
    assert under_way.wait("node-2", 0.0)[:2] == (None, "still under way")
    with pytest.raises(StillUnderWay):
        under_way.take("node-2")
    made.set()
    inventory, done_at = under_way.take("node-2", patience=30)
    assert inventory == "inventory" and done_at is not None and calls == ["node-2"]


def test_a_slow_replacement_goes_on_without_the_node_at_once_then_grows_back(tmp_path):
    provider = Slow(estimate=120.0)
    spec = LaunchSpec(nodes=3, recover=1, recover_wait=300, grace=30)
    said: list[str] = []
    rec = Recovery(ClusterState.for_cluster("dev", root=tmp_path), make_inventory(3), spec, said.append,
                   provider=provider)
    rec.restart_seconds = 8.0
    active = rec._replace_or_shrink(rec.cluster, Loss(["node-2"], "notice", 7))  # returns without the 300 s wait
    assert [n.name for n in active.nodes] == ["node-0", "node-1"]
    assert [e["event"] for e in rec.timeline.events] == ["replacement asked", "going on without it"]
    assert ("it takes about 120 s (told by the test), longer than a restart of the job, about 8 s: going on without "
            "it at once") in "\n".join(said)
    provider.release.set()
    for _ in range(100):  # growing back takes the replacement under way; it asks no second one
        try:
            rec._replace_now("node-2")
            break
        except StillUnderWay:
            threading.Event().wait(0.05)
    assert provider.asked == ["node-2"] and rec.timeline.events[-1]["event"] == "node back"


def test_a_bad_replace_delay_stops_a_recovering_run_before_it_starts(tmp_path, monkeypatch):
    from multinode.app.run import Run
    from multinode.providers.local.provider import LocalProvider

    monkeypatch.setenv("MULTINODE_REPLACE_DELAY", "two minutes")
    state = ClusterState.for_cluster("dev", root=tmp_path)
    with pytest.raises(UserError, match="MULTINODE_REPLACE_DELAY='two minutes' must be 0 or more seconds"):
        Run(state, make_inventory(3), LaunchSpec(nodes=3, recover=1), provider=LocalProvider())
    assert not any(tmp_path.iterdir())  # nothing written
