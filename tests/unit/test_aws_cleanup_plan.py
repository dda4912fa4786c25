"""Pure parts of the AWS clean-up and image delivery: which resources a sweep matches, reap's expiry rule,
and where `make image PUSH=1` pushes without ECR=."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, Node
from multinode.providers.aws.reap import expired
from multinode.providers.aws.sweep import Target
from multinode.providers.aws.ecr_target import main, push_target

NODE = Node(name="node-0", hostname="dev-node-0", private_ip="10.42.1.5", ssh_user="ubuntu", ssh_port=22,
            host_key="ssh-ed25519 AAAA")
URL = "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-dev-1a2b3c"


def _inventory(provider: str, extra: dict) -> Inventory:
    return Inventory(cluster="dev", provider=provider, nodes=(NODE,), subnet="10.42.1.0/24", ssh_key="/k",
                     known_hosts="/kh", workdir="/opt/multinode", extra=extra)


def test_a_target_with_an_id_matches_only_that_cluster():
    ours = {"managed-by": "multinode", "cluster": "dev", "cluster-id": "1a2b3c"}
    twin = {**ours, "cluster-id": "ffffff"}
    assert Target("dev", "1a2b3c").matches(ours) and not Target("dev", "1a2b3c").matches(twin)
    assert Target("dev").matches(ours) and Target("dev").matches(twin)  # no local state: every cluster of the name
    assert not Target("dev").matches({"cluster": "dev"})  # not made by multinode
    assert {"Name": "tag:cluster-id", "Values": ["1a2b3c"]} in Target("dev", "1a2b3c").filters()
    assert [f["Name"] for f in Target("dev").filters()] == ["tag:managed-by", "tag:cluster"]


@pytest.mark.parametrize("expiry, gone", [("2026-11-22T18:00:00Z", True), ("2026-11-23T12:00:01Z", False),
                                          ("?", True), ("2026-11-23T12:00:00+00:00", True)])
def test_reap_takes_only_instances_past_their_expiry(expiry, gone):
    assert expired(expiry, datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)) is gone


def test_push_target_is_the_cluster_repository_tagged_with_the_kind():
    assert push_target(_inventory("aws", {"ecr_repository_url": URL}), "cuda") == f"{URL}:cuda"
    with pytest.raises(UserError, match=r"cluster 'dev' \(local\) has no ECR repository; give the registry: "
                                        r"make image IMAGE=cuda PUSH=1 ECR="):
        push_target(_inventory("local", {}), "cuda")


def test_push_target_of_a_cluster_that_is_not_up_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert main(["nosuch", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cluster 'nosuch' is not up here")
