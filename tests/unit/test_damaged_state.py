"""State you can always recover from: a damaged inventory.json or known_hosts is one line naming the file
and the fix, and `down` still finds the provider that made the cluster."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_inventory

from multinode.app import verbs as orchestrator
from multinode.core.errors import UserError
from multinode.core.state import ClusterState


@pytest.fixture
def state(tmp_path) -> ClusterState:
    state = ClusterState.for_cluster("dev", root=tmp_path)
    inventory = dataclasses.replace(make_inventory(), known_hosts=str(state.known_hosts))
    inventory.save(state.inventory_path)
    state.known_hosts.write_text("10.200.7.10,dev-node-0 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0\n")
    return state


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_intact_state_loads(state):
    assert state.load_inventory().cluster == "dev"


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],  # truncated mid-write
    lambda text: "",  # emptied
    lambda text: text.replace('"nodes"', '"nodez"'),  # a field lost
    lambda text: "[]",  # not an object
])
def test_damaged_inventory_is_one_line_naming_the_file_and_the_fix(state, damage):
    state.inventory_path.write_text(damage(state.inventory_path.read_text()))
    with pytest.raises(UserError) as err:
        state.load_inventory()
    line = one_line(err)
    assert str(state.inventory_path) in line and "make down CLUSTER=dev" in line and "make up" in line


@pytest.mark.parametrize("content", [
    b"\xff\xfe\x00garbage\n",  # not text (paramiko: UnicodeDecodeError)
    b"10.200.7.10 ssh-ed25519\n",  # a line cut short
    b"10.200.7.10 ssh-ed25519 !!notbase64!!\n",
])
def test_damaged_known_hosts_is_one_line_naming_the_file(state, content):
    state.known_hosts.write_bytes(content)
    with pytest.raises(UserError) as err:
        state.load_inventory()
    line = one_line(err)
    assert str(state.known_hosts) in line and "make down CLUSTER=dev" in line


def test_missing_known_hosts_is_named(state):
    state.known_hosts.unlink()
    with pytest.raises(UserError, match="known_hosts is missing"):
        state.load_inventory()


def test_down_finds_the_provider_without_a_readable_inventory(state):
    state.inventory_path.write_text("{")
    assert orchestrator._provider_of(state, None) == "local"
    state.provider_dir.mkdir(parents=True)
    (state.provider_dir / "aws.json").write_text("{}")
    assert orchestrator._provider_of(state, None) == "aws"
    (state.provider_dir / "aws.json").unlink()
    assert orchestrator._provider_of(state, "aws") == "aws"
