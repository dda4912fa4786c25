"""Replacing one node of an EC2 cluster, with the real Terraform binary against a real moto_server (as
test_aws_moto.py: offline provider mirror, ``AWS_ENDPOINT_URL``; never AWS).

EC2's refusals cannot be asked of moto, so a small proxy (ec2_refusals.RefusingProxy) between Terraform and moto
answers RunInstances with EC2's own error document where the test says so and passes everything else through: the
real provider's real error output is what the provider reads. One cluster of 3 (one `up`, one `down`: Terraform's
init and apply are most of the time):

* node-1 replaced: exactly one new instance, with the cluster's configuration and an expiry of its own (TTL_HOURS
  from its launch, issue 47 item 7: before, it inherited the cluster's), its launch-to-ready time recorded as `up`
  recorded every node's (item 1);
* EC2 with no capacity for node-2's replacement in the cluster's zone: launched in the next zone that offers the
  type, said in one line (item 4; before, the one subnet sat in one zone and the replacement was refused);
* EC2 refusing node-0's replacement for the account's vCPU quota (VcpuLimitExceeded): one line naming the quota and
  how to raise it, nothing moved, the rest untouched (item 5); then, the quota raised, the same ask makes one instance.
(No placement group here: test_aws_capacity.py has the retry outside one; test_aws_zones.py the moves at `up`.)
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from ec2_refusals import RefusingProxy
from test_aws_moto import _instances, _spec, ec2, moto_clients, moto_url, offline_terraform, ssh_listener  # noqa: F401

from multinode.core.errors import CapacityRefused
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import launches
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration

ICE = ("InsufficientInstanceCapacity", "We currently do not have sufficient c6i.xlarge capacity in the Availability "
       "Zone you requested (us-east-1a).")  # EC2 sends it with HTTP 500 (ec2_refusals.error_document)
VCPU = ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 12 allows for the "
        "instance bucket that the specified instance type belongs to. Please visit "
        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")  # HTTP 400


def _provider(ssh_listener, waited: list) -> AwsProvider:
    def wait_ssh(hosts, port, timeout):  # moto's addresses are never connected to: a loopback listener stands in
        aws_ec2.wait_tcp(["127.0.0.1"] * len(hosts), port, timeout=timeout, poll=0.2)

    def wait_ready(inventory, image):
        waited.append([n.name for n in inventory.nodes])

    return AwsProvider(ssh_port=ssh_listener, wait_ssh=wait_ssh, wait_ready=wait_ready, clients=moto_clients)


def _by_id(ec2_client, cluster: str) -> dict[str, dict]:
    return {i["InstanceId"]: i for i in _instances(ec2_client, cluster)}


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance["Tags"]}


def _cloud_config(ec2_client, instance_id: str) -> dict:
    data = ec2_client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return yaml.safe_load(base64.b64decode(data["UserData"]["Value"]))


def _host_key_in_user_data(ec2_client, instance_id: str) -> str:
    return _cloud_config(ec2_client, instance_id)["ssh_keys"]["ed25519_public"]


def _bootstrap_in_user_data(ec2_client, instance_id: str) -> str:
    return _cloud_config(ec2_client, instance_id)["write_files"][0]["content"]


def _tfvars(state) -> dict:
    return json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())


def test_replacing_one_node_then_ec2_refusals_for_the_others(ec2, offline_terraform, moto_url, tmp_path, ssh_listener,
                                                             monkeypatch, capfd):
    state = ClusterState.for_cluster("tfrep", root=tmp_path)
    waited: list = []
    provider = _provider(ssh_listener, waited)
    inv = provider.up(_spec("tfrep", nodes=3), state)
    assert [(r["node"], r["how"], r["instance_type"]) for r in launches.read(state.provider_dir)] == [
        ("node-0", "up", "c6i.xlarge"), ("node-1", "up", "c6i.xlarge"), ("node-2", "up", "c6i.xlarge")]
    assert provider.replacement_estimate(state, inv).basis == "measured: median of 3 launches of c6i.xlarge in this cluster"
    assert _tfvars(state)["zones"] == ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]

    after = replacing_node_1_of_3_creates_exactly_one_instance(ec2, state, provider, inv, waited, capfd)
    assert [r["how"] for r in launches.read(state.provider_dir)] == ["up", "up", "up", "replacement"]
    assert provider.replacement_estimate(state, after).basis == "measured: median of 4 launches of c6i.xlarge in this cluster"
    after = no_capacity_in_its_zone_moves_node_2_to_the_next(ec2, moto_url, state, provider, after, monkeypatch, capfd)
    a_quota_refusal_is_one_line_and_the_rest_stays(ec2, moto_url, state, provider, after, monkeypatch)

    lines = provider.down(state)
    assert lines[-1].startswith("verified: no instance tagged cluster=tfrep")
    assert {i["State"]["Name"] for i in _instances(ec2, "tfrep")} == {"terminated"} and len(_instances(ec2, "tfrep")) == 6


def replacing_node_1_of_3_creates_exactly_one_instance(ec2, state, provider, inv, waited, capfd) -> Inventory:
    before = _by_id(ec2, "tfrep")
    old = before[inv.nodes[1].instance_id]
    capfd.readouterr()
    called = []

    def retire(ready: bool) -> None:  # a noticed node's call back: EC2's provider ends the old instance first, so it
        # comes first, and says nothing is ready yet
        called.append((ready, _by_id(ec2, "tfrep")[old["InstanceId"]]["State"]["Name"], len(_by_id(ec2, "tfrep"))))

    after = provider.replace(state, inv, "node-1", retire=retire)

    now = _by_id(ec2, "tfrep")
    (new_id,) = set(now) - set(before)
    assert called == [(False, "running", len(before))], called  # before the old instance ended and the new one launched
    assert now[old["InstanceId"]]["State"]["Name"] == "terminated"
    assert {iid: i["State"]["Name"] for iid, i in now.items() if iid != old["InstanceId"]} == {
        inv.nodes[0].instance_id: "running", inv.nodes[2].instance_id: "running", new_id: "running"}
    assert [n.instance_id for n in after.nodes] == [inv.nodes[0].instance_id, new_id, inv.nodes[2].instance_id]
    assert after.nodes[0] == inv.nodes[0] and after.nodes[2] == inv.nodes[2]
    new = now[new_id]
    # The cluster's tags, profile, subnet, security groups, type and image; the pinned host key.
    expires = _tfvars(state)["node_expires_at"]["1"]
    assert _tags(new) == {**_tags(old), "expiry": expires} and _tags(new)["node"] == "node-1"
    assert expires > _tags(old)["expiry"]  # its own TTL from its launch, later than the cluster's (RFC 3339 sorts)
    assert f"node-1: the replacement ends itself at {expires} (TTL_HOURS=8 from its launch" in capfd.readouterr().err
    assert new["IamInstanceProfile"]["Arn"] == old["IamInstanceProfile"]["Arn"]
    assert (new["SubnetId"], new["InstanceType"], new["ImageId"]) == (old["SubnetId"], old["InstanceType"], old["ImageId"])
    assert [g["GroupId"] for g in new["SecurityGroups"]] == [g["GroupId"] for g in old["SecurityGroups"]]
    assert _host_key_in_user_data(ec2, new_id) == inv.nodes[1].host_key == after.nodes[1].host_key
    assert f'echo "{expires}" >"$state/expiry"' in _bootstrap_in_user_data(ec2, new_id)  # its TTL timer's expiry
    assert f'echo "{_tags(old)["expiry"]}" >"$state/expiry"' in _bootstrap_in_user_data(ec2, inv.nodes[0].instance_id)
    node = after.nodes[1]
    assert (node.private_ip, node.public_ip) == (new["PrivateIpAddress"], new["PublicIpAddress"])
    assert f"{node.public_ip},{node.private_ip} {node.host_key}\n" in state.known_hosts.read_text()
    assert len(state.known_hosts.read_text().splitlines()) == 3
    assert Inventory.load(state.inventory_path) == after
    assert waited == [["node-0", "node-1", "node-2"], ["node-1"]]  # the bootstrap wait: of the new node only
    return after


def _zone_of_subnet(ec2_client, subnet_id: str) -> str:
    return ec2_client.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]["AvailabilityZone"]


def launch_zone(ec2_client, fields: dict) -> str | None:
    """The zone a RunInstances request launches into: its subnet's (``SubnetId``, or the network interface's
    ``NetworkInterface.1.SubnetId`` when it asks for a public address, as infra/ec2 does)."""
    subnet = next((v for k, v in fields.items() if k == "SubnetId" or k.endswith(".SubnetId")), None)
    return _zone_of_subnet(ec2_client, subnet) if subnet else None


def no_capacity_in_its_zone_moves_node_2_to_the_next(ec2, moto_url, state, provider, inv, monkeypatch, capfd):
    """EC2 has no c6i.xlarge left in us-east-1a, the cluster's zone: node-2's replacement goes to us-east-1b."""
    before = _by_id(ec2, "tfrep")

    def rule(fields):
        if fields.get("Action") == "RunInstances" and launch_zone(ec2, fields) == "us-east-1a":
            return (500, *ICE)
        return None

    proxy = RefusingProxy(moto_url, rule)
    capfd.readouterr()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # Terraform's AWS provider and boto3 both
        after = provider.replace(state, inv, "node-2")
    finally:
        proxy.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    assert [line for line in capfd.readouterr().err.splitlines() if "no capacity" in line] == [
        "node-2: no capacity in us-east-1a (EC2 said InsufficientInstanceCapacity); launching it in us-east-1b"]
    assert 1 <= len(proxy.refused) <= 3  # bounded (infra/ec2 max_retries), then the next zone at once
    (new_id,) = set(_by_id(ec2, "tfrep")) - set(before)
    assert _zone_of_subnet(ec2, _by_id(ec2, "tfrep")[new_id]["SubnetId"]) == "us-east-1b"
    assert after.nodes[2].instance_id == new_id and after.nodes[:2] == inv.nodes[:2]
    assert _tfvars(state)["node_zones"] == {"2": "us-east-1b"}
    return after


def a_quota_refusal_is_one_line_and_the_rest_stays(ec2, moto_url, state, provider, inv, monkeypatch):
    saved, known, tfvars = state.inventory_path.read_text(), state.known_hosts.read_text(), _tfvars(state)
    refuse = {"on": True}
    proxy = RefusingProxy(moto_url, lambda f: (400, *VCPU) if refuse["on"] and f.get("Action") == "RunInstances" else None)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with pytest.raises(CapacityRefused) as err:
            provider.replace(state, inv, "node-0")
        assert str(err.value) == (
            "node-0: no replacement (EC2 said VcpuLimitExceeded: the account's on-demand vCPU quota for c6i.xlarge in "
            "us-east-1 is used up; request an increase of 'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) "
            "instances' (L-1216C47A) in the Service Quotas console, or: aws service-quotas "
            "request-service-quota-increase --service-code ec2 --quota-code L-1216C47A --desired-value <vCPUs> "
            "--region us-east-1); go on with fewer nodes or ask again later")
        assert len(proxy.refused) == 1  # a quota: no retry, no zone, no group moves
        now = _tfvars(state)
        assert (now["node_zones"], now["outside_placement_group"]) == (tfvars["node_zones"], tfvars["outside_placement_group"])
        running = {iid for iid, i in _by_id(ec2, "tfrep").items() if i["State"]["Name"] == "running"}
        assert running == {inv.nodes[1].instance_id, inv.nodes[2].instance_id}  # asked to replace: the old one ended
        assert (state.inventory_path.read_text(), state.known_hosts.read_text()) == (saved, known)
        refuse["on"] = False  # the quota is raised: the same ask makes exactly one instance
        after = provider.replace(state, inv, "node-0")
    finally:
        proxy.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    assert after.nodes[1:] == inv.nodes[1:] and after.nodes[0].instance_id not in {n.instance_id for n in inv.nodes}
