"""The AWS provider's boto3 code against a real ``moto_server`` on loopback (never AWS).

Covered: status-check wait, tag discovery, leak verification (stopped counts), reap dry-run vs
--yes, ``down`` refusing to forget a leaked instance, and ``up``'s whole flow (tfvars, host keys,
status wait, SSH wait, known_hosts, inventory; destroy on failure) with Terraform replaced by a
stand-in that creates the instances through the same moto endpoint.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from multinode.config import ClusterSpec
from multinode.errors import NodeError, UserError
from multinode.inventory import Inventory
from multinode.providers import aws_ec2
from multinode.providers.aws import AwsProvider, reap, verify_gone
from multinode.state import ClusterState

pytestmark = pytest.mark.integration

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in images: no image look-up
MOTO = Path(sys.executable).with_name("moto_server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_url():
    port = _free_port()
    proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def ec2(moto_url, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # any client made by the code under test goes to moto too
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"), timeout=5).close()
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)


def _subnet(ec2) -> str:
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    return ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24")["Subnet"]["SubnetId"]


def _launch(ec2, count: int, cluster: str | None, subnet: str | None = None) -> list[str]:
    tags = [{"Key": "owner", "Value": "alice"}, {"Key": "expiry", "Value": "2026-11-22T18:00:00Z"}]
    if cluster:
        tags += [{"Key": "cluster", "Value": cluster}, {"Key": "managed-by", "Value": "multinode"}]
    extra = {"SubnetId": subnet} if subnet else {}
    reply = ec2.run_instances(ImageId=AMI, InstanceType="c6i.xlarge", MinCount=count, MaxCount=count,
                              TagSpecifications=[{"ResourceType": "instance", "Tags": tags}], **extra)
    return [i["InstanceId"] for i in reply["Instances"]]


def test_status_wait_passes_when_running_and_checks_ok(ec2):
    ids = _launch(ec2, 2, "alpha")
    aws_ec2.wait_status_ok(ec2, ids, timeout=30, poll=0.2)


def test_status_wait_fails_at_once_on_a_stopped_instance(ec2):
    ids = _launch(ec2, 2, "alpha")
    ec2.stop_instances(InstanceIds=[ids[1]])
    with pytest.raises(NodeError, match=f"instance {ids[1]} is stopp"):
        aws_ec2.wait_status_ok(ec2, ids, timeout=30, poll=0.2)


def test_tag_discovery_finds_only_the_cluster_and_only_ours(ec2):
    alpha = _launch(ec2, 2, "alpha")
    beta = _launch(ec2, 1, "beta")
    _launch(ec2, 1, None)  # someone else's instance: never ours to report or terminate
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2, "alpha")] == sorted(alpha)
    every = aws_ec2.tagged_instances(ec2)
    assert sorted(i.instance_id for i in every) == sorted(alpha + beta)
    assert {i.owner for i in every} == {"alice"} and {i.cluster for i in every} == {"alpha", "beta"}


def test_leak_verification_counts_stopped_and_clears_after_terminate(ec2):
    ids = _launch(ec2, 2, "alpha")
    ec2.stop_instances(InstanceIds=[ids[0]])
    with pytest.raises(UserError) as err:
        verify_gone(ec2, "alpha", REGION)
    assert all(i in str(err.value) for i in ids) and "make reap REGION=us-east-1" in str(err.value)
    assert "stopp" in str(err.value)
    aws_ec2.terminate(ec2, ids, timeout=60)
    assert "verified: no instance tagged cluster=alpha" in verify_gone(ec2, "alpha", REGION)[0]


def test_reap_lists_without_yes_and_terminates_with_yes(ec2):
    ids = _launch(ec2, 2, "alpha")
    dry = reap(REGION, None, yes=False, ec2=ec2)
    assert [line.split()[0] for line in dry[:-1]] == sorted(ids) and "YES=1" in dry[-1]
    assert len(aws_ec2.tagged_instances(ec2, "alpha")) == 2  # nothing touched
    done = reap(REGION, "alpha", yes=True, ec2=ec2)
    assert done[-1] == f"terminated 2 instances in {REGION}"
    assert aws_ec2.tagged_instances(ec2, "alpha") == []
    assert reap(REGION, "alpha", yes=False, ec2=ec2) == [
        f"no instance tagged cluster=alpha, managed-by=multinode is billing in {REGION}"]


class FakeTerraform:
    """Stands in for the terraform binary (its providers cannot be downloaded here): apply creates
    the instances through the same moto endpoint, output prints what infra/ec2/outputs.tf would."""

    def __init__(self, ec2, ssh_host: str, break_after_apply: bool = False) -> None:
        self.ec2, self.ssh_host, self.break_after_apply = ec2, ssh_host, break_after_apply
        self.calls: list[str] = []
        self.ids: list[str] = []

    def __call__(self, tf_dir: Path, command: str, *args: str) -> str:
        self.calls.append(command)
        tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())
        if command == "apply":
            assert (tf_dir / "compute.tf").exists()  # the module was copied next to its state
            self.ids = _launch(self.ec2, tfvars["nodes"], tfvars["cluster_name"], _subnet(self.ec2))
            (tf_dir / "terraform.tfstate").write_text("{}")
            if self.break_after_apply:
                self.ec2.stop_instances(InstanceIds=[self.ids[-1]])
        elif command == "output":
            found = self.ec2.describe_instances(InstanceIds=self.ids)["Reservations"][0]["Instances"]
            by_id = {i["InstanceId"]: i for i in found}
            nodes = [{"name": f"node-{n}", "hostname": f"{tfvars['cluster_name']}-node-{n}",
                      "private_ip": by_id[iid]["PrivateIpAddress"], "public_ip": self.ssh_host,
                      "instance_id": iid, "instance_type": "c6i.xlarge", "accelerator": "none",
                      "accelerator_count": 0} for n, iid in enumerate(self.ids)]
            return json.dumps({"inventory": {"sensitive": False, "value": {
                "cluster": tfvars["cluster_name"], "region": tfvars["region"], "subnet_cidr": "10.42.1.0/24",
                "ssh_user": "ubuntu", "nodes": nodes}}})
        elif command == "destroy":
            aws_ec2.terminate(self.ec2, self.ids, timeout=60)
        return ""


@pytest.fixture
def ssh_listener():
    """A listening socket on loopback standing in for the nodes' sshd (the TCP wait only connects)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def _spec(name: str, nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(name=name, provider="aws", nodes=nodes,
                       options={"region": REGION, "ssh_cidr": "203.0.113.4/32", "owner": "alice"})


def test_up_then_down_with_pinned_host_keys(ec2, tmp_path, ssh_listener):
    state = ClusterState.for_cluster("alpha", root=tmp_path)
    terraform = FakeTerraform(ec2, "127.0.0.1")
    provider = AwsProvider(terraform=terraform, ec2_client=lambda region: ec2, ssh_port=ssh_listener)
    inv = provider.up(_spec("alpha"), state)
    assert terraform.calls == ["init", "apply", "output"]
    assert Inventory.load(state.inventory_path) == inv and [n.instance_id for n in inv.nodes] == terraform.ids
    tfvars = json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())
    assert (state.provider_dir / "terraform" / "terraform.tfvars.json").stat().st_mode & 0o077 == 0
    pinned = state.known_hosts.read_text().splitlines()
    for node, key in zip(inv.nodes, tfvars["host_keys"]):
        assert node.host_key == key["public_key"]
        assert f"127.0.0.1,{node.private_ip} {key['public_key']}" in pinned
    assert tfvars["ssh_cidr"] == "203.0.113.4/32" and tfvars["ssh_public_key"].startswith("ssh-ed25519 ")
    lines = provider.down(state)
    assert terraform.calls[-1] == "destroy" and lines[-1].startswith("verified: no instance tagged cluster=alpha")
    assert not state.inventory_path.exists() and not state.provider_dir.exists()


def test_failed_up_destroys_what_it_made_and_reraises(ec2, tmp_path, ssh_listener):
    state = ClusterState.for_cluster("beta", root=tmp_path)
    terraform = FakeTerraform(ec2, "127.0.0.1", break_after_apply=True)
    provider = AwsProvider(terraform=terraform, ec2_client=lambda region: ec2, ssh_port=ssh_listener)
    with pytest.raises(NodeError, match="stopp"):
        provider.up(_spec("beta"), state)
    assert terraform.calls[-1] == "destroy"
    assert aws_ec2.tagged_instances(ec2, "beta") == [] and not state.inventory_path.exists()


def test_down_refuses_to_forget_a_leaked_instance(ec2, tmp_path):
    state = ClusterState.for_cluster("gamma", root=tmp_path)
    (state.provider_dir / "terraform").mkdir(parents=True)
    (state.provider_dir / "aws.json").write_text(json.dumps({"region": REGION, "cluster": "gamma"}))
    (state.provider_dir / "terraform" / "terraform.tfstate").write_text("{}")
    calls = []
    provider = AwsProvider(terraform=lambda tf_dir, *args: calls.append(args[0]) or "", ec2_client=lambda region: ec2)
    leaked = _launch(ec2, 1, "gamma")  # e.g. created outside Terraform's state, or a destroy that lied
    with pytest.raises(UserError, match=f"{leaked[0]}.*make reap REGION={REGION}"):
        provider.down(state)
    assert calls == ["destroy"] and (state.provider_dir / "aws.json").exists()  # state kept for another try
    reap(REGION, "gamma", yes=True, ec2=ec2)
    assert provider.down(state)[-1].startswith("verified")
    assert not state.provider_dir.exists()
