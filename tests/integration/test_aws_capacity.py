"""Issue 37 item 4: EC2 with no capacity inside the cluster placement group. A replacement (and `up`) launches the
refused node again outside the group and says so in one line; the AWS provider's own retries are bounded
(infra/ec2 max_retries), so a refusal surfaces in seconds, not after its default 25 tries.

The real Terraform binary and AWS provider against a real moto_server (test_aws_moto's fixtures), through
ec2_refusals.RefusingProxy: it answers the placement group API that moto 5.2.5 lacks (PlacementGroups, in the EC2 API
reference's shapes) and refuses every RunInstances INTO the group with EC2's own InsufficientInstanceCapacity
document while ``refuse`` is set; a RunInstances without a group goes to moto.
"""

from __future__ import annotations

import json

import pytest
from ec2_refusals import PlacementGroups, RefusingProxy, in_placement_group
from test_aws_moto import _instances, _spec, ec2, moto_clients, moto_url, offline_terraform, ssh_listener  # noqa: F401

from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration

ICE = ("InsufficientInstanceCapacity", "We currently do not have sufficient c6i.xlarge capacity in the Availability "
       "Zone you requested (us-east-1a). Our system will be working on provisioning additional capacity.")


class Capacity:
    """The proxy's rule: records each RunInstances (into the group or not) and refuses the in-group ones on demand."""

    def __init__(self) -> None:
        self.refuse = False
        self.launches: list[tuple[bool, bool]] = []  # (into the group, refused)

    def __call__(self, fields):
        if fields.get("Action") != "RunInstances":
            return None
        grouped = in_placement_group(fields)
        refused = self.refuse and grouped
        self.launches.append((grouped, refused))
        return (500, *ICE) if refused else None


def _provider(ssh_listener) -> AwsProvider:
    def wait_ssh(hosts, port, timeout):  # moto's addresses are never connected to: a loopback listener stands in
        aws_ec2.wait_tcp(["127.0.0.1"] * len(hosts), port, timeout=timeout, poll=0.2)

    return AwsProvider(ssh_port=ssh_listener, wait_ssh=wait_ssh, wait_ready=lambda inventory, image: None,
                       clients=moto_clients)


def test_a_replacement_refused_in_the_placement_group_is_launched_outside_it(ec2, offline_terraform, moto_url, tmp_path,
                                                                             ssh_listener, monkeypatch, capsys):
    capacity, groups = Capacity(), PlacementGroups()
    proxy = RefusingProxy(moto_url, capacity, answer=groups)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # Terraform's AWS provider and boto3 both
    monkeypatch.setenv("TF_VAR_placement_group", "true")  # the production default
    state = ClusterState.for_cluster("tfcap", root=tmp_path)
    provider = _provider(ssh_listener)
    try:
        inv = provider.up(_spec("tfcap", nodes=2), state)
        assert list(groups.groups) == [f"multinode-tfcap-{json.loads((state.provider_dir / 'aws.json').read_text())['cluster_id']}"]
        assert capacity.launches == [(True, False), (True, False)]  # both nodes into the group
        capsys.readouterr()

        capacity.refuse = True  # EC2 has no capacity left inside the group
        after = provider.replace(state, inv, "node-1")

        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "placement group" in line]
        assert lines == ["node-1: no capacity in the cluster placement group (EC2 said InsufficientInstanceCapacity); "
                         "launching it outside the group (same subnet and zone, less bandwidth to the others)"]
        refused = [launch for launch in capacity.launches[2:] if launch[1]]
        # Bounded: the provider's max_retries (3) tries, not its default 25.
        assert 1 <= len(refused) <= 3 and capacity.launches[2:] == [(True, True)] * len(refused) + [(False, False)]
        tfvars = json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())
        assert tfvars["outside_placement_group"] == [1]
        running = {i["InstanceId"] for i in _instances(ec2, "tfcap") if i["State"]["Name"] == "running"}
        assert running == {inv.nodes[0].instance_id, after.nodes[1].instance_id} and after.nodes[0] == inv.nodes[0]
        assert after.nodes[1].instance_id != inv.nodes[1].instance_id

        capacity.refuse = False
        lines = provider.down(state)
    finally:
        proxy.close()
    assert lines[-1].startswith("verified: no instance tagged cluster=tfcap") and groups.groups == {}


def test_up_launches_the_nodes_ec2_refused_in_the_placement_group_outside_it(ec2, offline_terraform, moto_url, tmp_path,
                                                                             ssh_listener, monkeypatch, capsys):
    """Every launch into the group refused (moto records no instance's group, so a node made inside it would look
    changed to a second full apply: only the all-refused case is faithful here)."""
    capacity, groups = Capacity(), PlacementGroups()
    capacity.refuse = True
    proxy = RefusingProxy(moto_url, capacity, answer=groups)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("TF_VAR_placement_group", "true")
    state = ClusterState.for_cluster("tfcapup", root=tmp_path)
    provider = _provider(ssh_listener)
    try:
        inv = provider.up(_spec("tfcapup", nodes=2), state)
        err = capsys.readouterr().err
        assert [line for line in err.splitlines() if "placement group" in line] == [
            "node-0, node-1: no capacity in the cluster placement group (EC2 said InsufficientInstanceCapacity); "
            "launching them outside the group (same subnet and zone, less bandwidth to the others)"]
        tfvars = json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())
        assert tfvars["outside_placement_group"] == [0, 1] and len(groups.groups) == 1  # the group stays
        refused = [launch for launch in capacity.launches if launch[1]]
        assert 2 <= len(refused) <= 6 and capacity.launches[-2:] == [(False, False), (False, False)]  # 3 tries each
        running = {i["InstanceId"] for i in _instances(ec2, "tfcapup") if i["State"]["Name"] == "running"}
        assert running == {n.instance_id for n in inv.nodes} and len(running) == 2
        capacity.refuse = False
        provider.down(state)
    finally:
        proxy.close()
    assert groups.groups == {}
