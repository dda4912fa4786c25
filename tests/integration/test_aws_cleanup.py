"""Two clusters of one name in one account, a TTL end, `reap` and `down` with no local state: the real
terraform binary and AWS provider against moto_server on loopback (see test_aws_moto.py), boto3 reading
back what was made and what is left.

Shown here: every instance carries the cluster's instance profile whose role has
AmazonEC2ContainerRegistryReadOnly; the ECR repository of each cluster exists at the URL the inventory
records; the subnet's zone is the first one moto's instance type offerings list; the account-wide names
(key pair, IAM role and profile, ECR repository, security group) of the two same-named clusters differ;
`reap` deletes the network, key pair, role, profile and empty repository of the cluster whose instances
ended (terminated with boto3, as the TTL timer would) and leaves the other cluster alone; `down` of the
other cluster with its local state gone deletes it by its tags, keeping its repository while it holds an
image unless YES.
"""

from __future__ import annotations

import json
import shutil

import boto3
import pytest
from test_aws_moto import (REGION, _instances, _spec, ec2, moto_clients, moto_url, offline_terraform,  # noqa: F401
                           ssh_listener)

from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.provider import AwsProvider
from multinode.providers.aws.reap import reap
from multinode.core.state import ClusterState

pytestmark = pytest.mark.integration

ECR_READ_ONLY = "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"


def _tagged(ec2, kind: str, cluster_id: str) -> list:  # noqa: F811
    filters = [{"Name": "tag:cluster", "Values": ["twin"]}, {"Name": "tag:cluster-id", "Values": [cluster_id]}]
    describe = {"vpc": ("describe_vpcs", "Vpcs"), "sg": ("describe_security_groups", "SecurityGroups"),
                "key": ("describe_key_pairs", "KeyPairs"), "subnet": ("describe_subnets", "Subnets"),
                "igw": ("describe_internet_gateways", "InternetGateways"),
                "rt": ("describe_route_tables", "RouteTables")}[kind]
    return getattr(ec2, describe[0])(Filters=filters)[describe[1]]


def _roles(iam) -> list[str]:
    return sorted(r["RoleName"] for r in iam.list_roles(PathPrefix="/multinode/")["Roles"])


def _repositories(ecr) -> list[str]:
    return sorted(r["repositoryName"] for r in ecr.describe_repositories()["repositories"])


def test_two_same_named_clusters_ttl_end_reap_and_down_without_state(ec2, offline_terraform, tmp_path,  # noqa: F811
                                                                     ssh_listener, moto_url, monkeypatch):
    iam = boto3.client("iam", region_name=REGION, endpoint_url=moto_url)
    ecr = boto3.client("ecr", region_name=REGION, endpoint_url=moto_url)

    def wait_ssh(hosts, port, timeout):  # moto's made-up addresses are never connected to
        aws_ec2.wait_tcp(["127.0.0.1"] * len(hosts), port, timeout=timeout, poll=0.2)

    provider = AwsProvider(ssh_port=ssh_listener, wait_ssh=wait_ssh, wait_ready=lambda inventory, image: None,
                           clients=moto_clients)
    first = ClusterState.for_cluster("twin", root=tmp_path / "laptop-a")
    second = ClusterState.for_cluster("twin", root=tmp_path / "laptop-b")
    inv_a = provider.up(_spec("twin", nodes=1), first)
    inv_b = provider.up(_spec("twin", nodes=1), second)  # same name, same account: no collision
    id_a, id_b = inv_a.extra["cluster_id"], inv_b.extra["cluster_id"]
    assert id_a != id_b

    offered = sorted(o["Location"] for o in ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["c6i.xlarge"]}])["InstanceTypeOfferings"])
    for inv, cid in ((inv_a, id_a), (inv_b, id_b)):
        name = f"multinode-twin-{cid}"
        # Every instance: the cluster's profile, whose role has exactly ECR read-only.
        for found in _instances(ec2, "twin"):
            if found["InstanceId"] not in {n.instance_id for n in inv.nodes}:
                continue
            profile = iam.get_instance_profile(InstanceProfileName=found["IamInstanceProfile"]["Arn"].split("/")[-1])
            assert profile["InstanceProfile"]["InstanceProfileName"] == name
            (role,) = profile["InstanceProfile"]["Roles"]
            assert role["RoleName"] == inv.extra["instance_role"] == name
            attached = iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
            assert [p["PolicyArn"] for p in attached] == [ECR_READ_ONLY]
            (subnet,) = ec2.describe_subnets(SubnetIds=[found["SubnetId"]])["Subnets"]
            assert subnet["AvailabilityZone"] == inv.extra["zone"] == offered[0]
        # The repository exists where the inventory says.
        (repo,) = ecr.describe_repositories(repositoryNames=[name])["repositories"]
        assert repo["repositoryUri"] == inv.extra["ecr_repository_url"] and inv.extra["ecr_created"]
        assert [k["KeyName"] for k in _tagged(ec2, "key", cid)] == [name]
        assert sorted(g["GroupName"] for g in _tagged(ec2, "sg", cid)) == ["default", name]  # + the VPC's, closed
    assert _roles(iam) == sorted([f"multinode-twin-{id_a}", f"multinode-twin-{id_b}"])

    # Cluster A ends by its TTL (the instance terminates itself); its laptop forgot it.
    aws_ec2.terminate(ec2, [n.instance_id for n in inv_a.nodes], timeout=60)
    shutil.rmtree(first.root)
    listed = reap(REGION, "twin", yes=False, ec2=ec2, clients=moto_clients(REGION))
    assert listed[0] == f"cluster=twin, cluster-id={id_a}: network, key pair, IAM role and ECR repository left behind (no instance)"
    assert "0 instances would be terminated and 1 clusters' resources deleted" in listed[-1]
    assert _tagged(ec2, "vpc", id_a)  # nothing touched without YES
    swept = reap(REGION, "twin", yes=True, ec2=ec2, clients=moto_clients(REGION))
    assert all(line.startswith(f"cluster=twin, cluster-id={id_a}: ") for line in swept), swept
    for what in ("deleted VPC", "deleted subnet", "deleted internet gateway", "deleted route table",
                 "deleted security group", "deleted key pair", "deleted instance profile", "deleted IAM role",
                 "deleted ECR repository"):
        assert any(what in line for line in swept), (what, swept)
    for kind in ("vpc", "subnet", "igw", "rt", "sg", "key"):
        assert _tagged(ec2, kind, id_a) == [], kind
    assert _roles(iam) == [f"multinode-twin-{id_b}"] and _repositories(ecr) == [f"multinode-twin-{id_b}"]
    # Cluster B is untouched: running, its network and names in place.
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2, "twin")] == [n.instance_id for n in inv_b.nodes]
    assert _tagged(ec2, "vpc", id_b) and _tagged(ec2, "key", id_b)

    # Cluster B: an image was pushed to its repository; then its local state is lost too.
    ecr.put_image(repositoryName=f"multinode-twin-{id_b}", imageTag="cpu", imageManifest=json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
         "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1, "digest": "sha256:" + "0" * 64},
         "layers": []}))
    shutil.rmtree(second.root)
    monkeypatch.setenv("MULTINODE_REGION", REGION)
    lines = provider.down(ClusterState.for_cluster("twin", root=tmp_path / "laptop-b"))
    assert lines[0] == f"terminated instance {inv_b.nodes[0].instance_id}"
    assert f"kept ECR repository multinode-twin-{id_b}: it holds 1 images (YES=1 deletes it with them)" in lines
    assert lines[-1].startswith("verified: no instance tagged cluster=twin, managed-by=multinode")
    for kind in ("vpc", "subnet", "igw", "rt", "sg", "key"):
        assert _tagged(ec2, kind, id_b) == [], kind
    assert _roles(iam) == [] and aws_ec2.tagged_instances(ec2, "twin") == []
    assert _repositories(ecr) == [f"multinode-twin-{id_b}"]
    lines = provider.down(ClusterState.for_cluster("twin", root=tmp_path / "laptop-b"), yes=True)
    assert f"deleted ECR repository multinode-twin-{id_b} and its 1 images" in lines
    assert _repositories(ecr) == []
