"""The local provider's replacement knob and known_hosts lines (files only: no namespace, no process)."""

from __future__ import annotations

import pytest

from multinode.core.errors import CapacityRefused, MultinodeError, UserError
from multinode.core.state import ClusterState
from multinode.providers.local import faults
from multinode.providers.local.netns import NetPlan
from multinode.providers.local.node import known_hosts_line


@pytest.fixture
def state(tmp_path):
    return ClusterState.for_cluster("rk", root=tmp_path)


def test_capacity_refused_is_not_a_user_error():
    err = CapacityRefused("node-2: no capacity")
    assert isinstance(err, MultinodeError) and not isinstance(err, UserError)
    assert err.exit_code == 69 and str(err) == "node-2: no capacity"


@pytest.mark.parametrize("text, left", [("", None), ("\n", None), ("3\n", 3), ("0", 0), ("junk", None)])
def test_refusals_left_reads_the_knob(text, left):
    assert faults.refusals_left(text) == left


def test_no_knob_allows(state):
    faults.take_refusal(state, "node-1")  # no file: returns quietly
    assert not faults.refusal_path(state).exists()


def test_refuse_always_until_allowed(state):
    path = faults.refuse_replacements(state)
    assert path == state.provider_dir / "refuse-replacements" and path.read_text() == ""
    for _ in range(3):
        with pytest.raises(CapacityRefused) as err:
            faults.take_refusal(state, "node-2")
        assert str(err.value).startswith(
            f"node-2: no capacity for a replacement (the local provider was told to refuse: {path}); ")
        assert "\n" not in str(err.value)
    faults.allow_replacements(state)
    faults.take_refusal(state, "node-2")
    faults.allow_replacements(state)  # idempotent


def test_refuse_the_next_n_then_allow(state):
    faults.refuse_replacements(state, 2)
    with pytest.raises(CapacityRefused):
        faults.take_refusal(state, "node-1")
    assert faults.refusal_path(state).read_text() == "1\n"
    with pytest.raises(CapacityRefused):
        faults.take_refusal(state, "node-1")
    assert not faults.refusal_path(state).exists()
    faults.take_refusal(state, "node-1")


def test_refuse_needs_a_positive_count(state):
    with pytest.raises(UserError, match="n=0"):
        faults.refuse_replacements(state, 0)
    assert not faults.refusal_path(state).exists()


def test_known_hosts_line_by_ip_and_hostname_or_by_port():
    plan = NetPlan("kh", 3, "10.201.7.0/24", 1500)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKey"
    assert known_hosts_line(plan, 2, 22, key) == f"10.201.7.12,kh-node-2 {key}\n"
    assert known_hosts_line(plan, 1, 2222, key) == f"[10.201.7.11]:2222 {key}\n"


def test_a_node_keeps_its_mac_address_across_replacements():
    plan = NetPlan("kh", 3, "10.201.7.0/24", 1500)
    assert plan.mac(2) == NetPlan("kh", 3, "10.201.7.0/24", 1500).mac(2) == f"02:{plan.tag[:2]}:{plan.tag[2:4]}:{plan.tag[4:]}:00:02"
    assert len({plan.mac(i) for i in range(64)}) == 64 and plan.mac(0) != NetPlan("other", 3, plan.subnet, 1500).mac(0)


def test_the_bridge_has_its_own_mac_apart_from_every_node():
    """Set at creation, so it never follows its ports (a lost node's veth took it along: netns.NetPlan.bridge_mac)."""
    plan = NetPlan("kh", 3, "10.201.7.0/24", 1500)
    assert plan.bridge_mac == NetPlan("kh", 3, "10.201.7.0/24", 1500).bridge_mac
    assert plan.bridge_mac not in {plan.mac(i) for i in range(64)} and int(plan.bridge_mac[:2], 16) & 2


def test_a_vanishing_machine_freezes_every_process_before_it_kills_any(monkeypatch):
    """Killed one by one, a process that outlived its neighbour acted on its death (a starter read its killed rank's
    missing exit file as exit 1; CI's stop 62 restarted every process for it): every process -- one forked after the
    first listing too -- gets SIGSTOP before any gets SIGKILL."""
    import os
    import signal

    from multinode.providers.local import netns

    alive, sent = {10, 11}, []
    listings = iter([{10, 11}, {10, 11, 12}])  # 12: forked by 11 before 11 was stopped

    def pids(ns):
        assert ns == "mn-c-1"
        return sorted(next(listings, alive))

    def kill(pid, sig):
        sent.append((pid, sig))
        alive.add(pid) if sig == signal.SIGSTOP else alive.discard(pid)

    monkeypatch.setattr(netns, "netns_pids", pids)
    monkeypatch.setattr(os, "kill", kill)
    assert netns.stop_processes(["mn-c-1"], grace=0.0, warn=False) == 3
    signals = [sig for _, sig in sent]
    assert signals == [signal.SIGSTOP] * 3 + [signal.SIGKILL] * 3, sent
    assert {pid for pid, _ in sent[:3]} == {pid for pid, _ in sent[3:]} == {10, 11, 12} and not alive
