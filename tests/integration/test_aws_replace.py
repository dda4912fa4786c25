"""Replacing one node of an EC2 cluster, with the real Terraform binary against a real moto_server (as
test_aws_moto.py: offline provider mirror, ``AWS_ENDPOINT_URL``; never AWS).

EC2's "no capacity" cannot be asked of moto, so one test puts a small proxy (ec2_refusals.RefusingProxy) between
Terraform and moto that answers RunInstances with EC2's own error document (``InsufficientInstanceCapacity``) and
passes everything else through: the real provider's real error output is what the mapping to CapacityRefused reads.
(No placement group here: test_aws_capacity.py has the retry outside one.)
"""

from __future__ import annotations

import base64

import pytest
import yaml
from ec2_refusals import RefusingProxy
from test_aws_moto import _instances, _spec, ec2, moto_clients, moto_url, offline_terraform, ssh_listener  # noqa: F401

from multinode.core.errors import CapacityRefused
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration

ICE = ("InsufficientInstanceCapacity", "We currently do not have sufficient c6i.xlarge capacity in the Availability "
       "Zone you requested (us-east-1a).")  # EC2 sends it with HTTP 500 (ec2_refusals.error_document)


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


def _host_key_in_user_data(ec2_client, instance_id: str) -> str:
    data = ec2_client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return yaml.safe_load(base64.b64decode(data["UserData"]["Value"]))["ssh_keys"]["ed25519_public"]


def test_replacing_one_node_then_no_capacity_for_another(ec2, offline_terraform, moto_url, tmp_path, ssh_listener,
                                                         monkeypatch):
    """One cluster of 3 (one `up`, one `down`: Terraform's init and apply are most of the time): node-1 replaced,
    then EC2 with no capacity for node-2's replacement, then capacity back."""
    state = ClusterState.for_cluster("tfrep", root=tmp_path)
    waited: list = []
    provider = _provider(ssh_listener, waited)
    inv = provider.up(_spec("tfrep", nodes=3), state)
    after = replacing_node_1_of_3_creates_exactly_one_instance(ec2, state, provider, inv, waited)
    no_capacity_is_capacity_refused_and_the_rest_stays(ec2, moto_url, state, provider, after, inv.nodes[1], monkeypatch)

    lines = provider.down(state)
    assert lines[-1].startswith("verified: no instance tagged cluster=tfrep")
    assert {i["State"]["Name"] for i in _instances(ec2, "tfrep")} == {"terminated"} and len(_instances(ec2, "tfrep")) == 5


def replacing_node_1_of_3_creates_exactly_one_instance(ec2, state, provider, inv, waited) -> Inventory:
    before = _by_id(ec2, "tfrep")
    old = before[inv.nodes[1].instance_id]

    after = provider.replace(state, inv, "node-1")

    now = _by_id(ec2, "tfrep")
    (new_id,) = set(now) - set(before)
    assert now[old["InstanceId"]]["State"]["Name"] == "terminated"
    assert {iid: i["State"]["Name"] for iid, i in now.items() if iid != old["InstanceId"]} == {
        inv.nodes[0].instance_id: "running", inv.nodes[2].instance_id: "running", new_id: "running"}
    assert [n.instance_id for n in after.nodes] == [inv.nodes[0].instance_id, new_id, inv.nodes[2].instance_id]
    assert after.nodes[0] == inv.nodes[0] and after.nodes[2] == inv.nodes[2]
    new = now[new_id]
    # The cluster's tags (expiry: its TTL), profile, subnet, security groups, type and image; the pinned host key.
    assert _tags(new) == _tags(old) and _tags(new)["node"] == "node-1"
    assert new["IamInstanceProfile"]["Arn"] == old["IamInstanceProfile"]["Arn"]
    assert (new["SubnetId"], new["InstanceType"], new["ImageId"]) == (old["SubnetId"], old["InstanceType"], old["ImageId"])
    assert [g["GroupId"] for g in new["SecurityGroups"]] == [g["GroupId"] for g in old["SecurityGroups"]]
    assert _host_key_in_user_data(ec2, new_id) == inv.nodes[1].host_key == after.nodes[1].host_key
    node = after.nodes[1]
    assert (node.private_ip, node.public_ip) == (new["PrivateIpAddress"], new["PublicIpAddress"])
    assert f"{node.public_ip},{node.private_ip} {node.host_key}\n" in state.known_hosts.read_text()
    assert len(state.known_hosts.read_text().splitlines()) == 3
    assert Inventory.load(state.inventory_path) == after
    assert waited == [["node-0", "node-1", "node-2"], ["node-1"]]  # the bootstrap wait: of the new node only
    return after


def no_capacity_is_capacity_refused_and_the_rest_stays(ec2, moto_url, state, provider, inv, replaced, monkeypatch):
    """``inv``: the cluster after node-1's replacement (``replaced``: node-1's first instance, terminated)."""
    saved, known = state.inventory_path.read_text(), state.known_hosts.read_text()
    # The AWS provider retries InsufficientInstanceCapacity on RunInstances up to max_retries times with back-off
    # (terraform-provider-aws, internal/service/ec2 service_package: the code is marked retryable); infra/ec2 bounds
    # it (max_retries = 3, not the provider's 25), so the refusal surfaces in seconds.
    refuse = {"on": True}
    proxy = RefusingProxy(moto_url, lambda fields: (500, *ICE) if refuse["on"] and fields.get("Action") == "RunInstances"
                          else None)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # Terraform's AWS provider and boto3 both
        with pytest.raises(CapacityRefused) as err:
            provider.replace(state, inv, "node-2")
        assert str(err.value).startswith("node-2: no capacity for a replacement (EC2 said InsufficientInstanceCapacity)")
        assert 1 <= len(proxy.refused) <= 3  # bounded (infra/ec2 max_retries)
        now = _by_id(ec2, "tfrep")
        assert {iid: i["State"]["Name"] for iid, i in now.items()} == {
            inv.nodes[0].instance_id: "running", inv.nodes[1].instance_id: "running", replaced.instance_id: "terminated",
            inv.nodes[2].instance_id: "terminated"}  # asked to replace: the old one ended, no new one made
        assert (state.inventory_path.read_text(), state.known_hosts.read_text()) == (saved, known)
        refuse["on"] = False  # capacity is back: the same ask makes exactly one instance
        after = provider.replace(state, inv, "node-2")
    finally:
        proxy.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    assert len(_by_id(ec2, "tfrep")) == 5 and after.nodes[:2] == inv.nodes[:2]
    assert after.nodes[2].instance_id not in (n.instance_id for n in (*inv.nodes, replaced))
