"""multinode.providers.aws.readiness, pure parts: the probe command per node and how its answers are read."""

from __future__ import annotations

import pytest

from multinode.core.errors import UserError
from multinode.core.inventory import Node
from multinode.providers.aws.readiness import FAILED, READY, WAITING, Bootstrap, parse_probe, probe_command, tail_command

GPU_NODE = Node(name="node-1", hostname="gpu-node-1", private_ip="10.42.1.5", ssh_user="ubuntu", ssh_port=22,
                host_key="ssh-ed25519 AAAA", accelerator="nvidia", accelerator_count=1)


def test_the_probe_reads_the_node_own_files_and_checks_image_and_gpus():
    boot = Bootstrap(ready="/t/{node}/ready", failed="/t/{node}/failed", log="/t/{node}/log")
    command = probe_command(boot, GPU_NODE, "123.dkr.ecr.us-east-1.amazonaws.com/x:cuda")
    assert "[ -e /t/node-1/failed ]" in command and "[ ! -e /t/node-1/ready ]" in command
    assert "want=123.dkr.ecr.us-east-1.amazonaws.com/x:cuda" in command
    assert '"${gpus:-0}" -lt 1 ]' in command and "cloud-init status" in command
    # The failed marker is read before cloud-init and the ready marker: a failure is never "waiting".
    assert command.index("/t/node-1/failed") < command.index("cloud-init") < command.index("/t/node-1/ready")
    assert tail_command(boot, GPU_NODE).startswith("tail -n 30 /t/node-1/log")


def test_the_default_paths_are_the_ones_the_bootstrap_writes():
    boot = Bootstrap()
    assert (boot.ready, boot.failed, boot.log) == (
        "/var/lib/multinode/ready", "/var/lib/multinode/failed", "/var/log/multinode-bootstrap.log")
    with pytest.raises(UserError, match="tail_lines=0"):
        Bootstrap(tail_lines=0)


@pytest.mark.parametrize("exit_code, stdout, error, state, detail", [
    (0, "ready\n", None, READY, ""),
    (0, "waiting cloud-init is running\n", None, WAITING, "cloud-init is running"),
    (0, "failed the bootstrap failed: line 9 exit 1: docker pull x\n", None, FAILED,
     "the bootstrap failed: line 9 exit 1: docker pull x"),
    (None, "", "connection refused", WAITING, "no SSH answer yet (connection refused)"),
    (255, "", None, WAITING, "probe exited 255"),
    (0, "motd line\nsomething else\n", None, WAITING, "unexpected probe output 'something else'"),
])
def test_probe_answers(exit_code, stdout, error, state, detail):
    probe = parse_probe("node-1", exit_code, stdout, error)
    assert (probe.node, probe.state, probe.detail) == ("node-1", state, detail)


def test_the_status_line_of_a_ready_marker_names_torch_cuda_nccl_and_libmpi():
    from multinode.providers.aws.readiness import software_summary

    marker = ("17 min up\nimage=\ngpus=1\nruntime=host /opt/multinode/venv/bin/python\ntorch=2.13.0\ncuda=13.0\nhip=None\n"
              "nccl=2.29.7\nmpi4py=4.1.2\nlibmpi=Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6\n")
    assert software_summary(marker) == ("torch 2.13.0 (CUDA 13.0, NCCL 2.29.7); libmpi: Open MPI v4.1.6, package: Debian "
                                        "OpenMPI, ident: 4.1.6, repo rev: v4.1.6; mpi4py 4.1.2")
    assert software_summary("up 3 minutes\n") is None  # a node without a marker (local nodes)
    assert software_summary("torch=2.13.0+cpu\ncuda=None\nnccl=None\nlibmpi=None\n") == "torch 2.13.0+cpu"
