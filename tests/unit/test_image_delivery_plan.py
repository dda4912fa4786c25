"""make image PUSH=1: the reference pushed is the one the cluster's nodes run, and every node pulls it (issue 27, 5)."""

from __future__ import annotations

import dataclasses

import pytest

from multinode.core.errors import UserError
from multinode.images.delivery import main, pull_lines, push_target

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mn-dev:cuda-1"


def test_the_push_goes_to_the_image_the_nodes_run_not_to_a_tag_of_the_kind(make_inv):
    inv = make_inv(2, runtime="docker", accelerator="nvidia", image=ECR)
    assert push_target(inv, "cuda") == ECR  # before: <repository>:cuda, which no node ran
    inv = dataclasses.replace(inv, extra={**inv.extra, "container_cli": "sudo -n podman --root /s"})
    assert pull_lines(inv) == {f"node-{i}": f"sudo -n podman --root /s pull {ECR}" for i in range(2)}


@pytest.mark.parametrize("image, runtime, kind, message", [
    (ECR, "docker", "cpu", f"IMAGE=cpu but cluster 'dev' runs {ECR} on cuda nodes; use IMAGE=cuda"),
    ("multinode-cuda:latest", "docker", "cuda", "cluster 'dev' runs multinode-cuda:latest, a local tag no registry holds; "
     "give the registry: make image IMAGE=cuda PUSH=1 ECR=<registry>"),
    (None, "host", "cuda", "cluster 'dev' runs jobs on the nodes' own Python, not in an image;"),
])
def test_a_push_no_node_would_run_is_refused_in_one_line(make_inv, image, runtime, kind, message):
    inv = make_inv(2, runtime=runtime, accelerator="nvidia", image=image)
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        push_target(inv, kind)


def test_the_command_line_refuses_a_cluster_that_is_not_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert main(["target", "dev", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cluster 'dev' is not up here") and err.count("\n") == 1
    assert main(["push", "dev"]) == 2 and "'push' is not a verb" in capsys.readouterr().err
