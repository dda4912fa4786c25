"""`make status` (multinode.app.verbs.status): each node, whether it answers SSH and, where its bootstrap left a ready
marker (EC2 nodes), what the jobs run on."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_inventory

from multinode.app import verbs as orchestrator
from multinode.core.state import ClusterState


@pytest.fixture
def state(tmp_path) -> ClusterState:
    state = ClusterState.for_cluster("dev", root=tmp_path)
    dataclasses.replace(make_inventory(), known_hosts=str(state.known_hosts)).save(state.inventory_path)
    state.known_hosts.write_text("10.200.7.10,dev-node-0 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0\n")
    return state


def test_status_shows_what_each_node_s_ready_marker_records(state, monkeypatch, capsys):
    """Issue 37 item 6: `make status` prints the runtime a node's bootstrap recorded (torch, CUDA, NCCL, libmpi) under
    it; a node without a marker (local nodes) gets no such line. The SSH probe is replaced by its answers."""
    monkeypatch.setenv("MULTINODE_HOME", str(state.root.parent))
    asked = []

    def probe(inventory, timeout=5.0, command=""):
        asked.append(command)
        marker = "torch=2.13.0\ncuda=13.0\nhip=None\nnccl=2.29.7\nmpi4py=4.1.2\nlibmpi=Open MPI v4.1.6, package: x\n"
        return {"node-0": (True, "up 3 minutes\nimage=\ngpus=1\n" + marker), "node-1": (True, "up 3 minutes"),
                "node-2": (False, "timed out")}

    monkeypatch.setattr(orchestrator, "probe_ssh", probe)
    assert orchestrator.status("dev") == 1  # node-2 does not answer
    out = capsys.readouterr().out.splitlines()
    assert "cat /var/lib/multinode/ready" in asked[0]
    at = next(i for i, line in enumerate(out) if line.lstrip().startswith("node-0"))
    assert out[at + 1].strip() == "torch 2.13.0 (CUDA 13.0, NCCL 2.29.7); libmpi: Open MPI v4.1.6, package: x; mpi4py 4.1.2"
    assert out[at + 2].lstrip().startswith("node-1") and out[at + 3].lstrip().startswith("node-2")
