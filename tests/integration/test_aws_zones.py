"""Issue 47 item 4: a zone without capacity no longer breaks `up` and every replacement, and EC2's two spot errors
are said as what they are. The real Terraform binary and AWS provider against a real moto_server (test_aws_moto's
fixtures), through ec2_refusals.RefusingProxy: it answers the placement group API moto 5.2.5 lacks and refuses
RunInstances with EC2's own error documents where the test says so (the zone of a launch: its subnet's).

One spot cluster of 2 in a placement group, where the cluster's zone (us-east-1a) has no capacity at all:

* `up`: both nodes refused in the group, then outside it in us-east-1a, then launched in us-east-1b -- two lines;
  the cluster has a subnet in every zone that offers c6i.xlarge (before: one subnet, one zone, and `up` failed);
* node-1's replacement refused with ``MaxSpotInstanceCountExceeded``: one line naming the spot quota, nothing moved
  (before: treated as a placement problem, the node moved out of the group for good);
* node-1's replacement refused with ``SpotMaxPriceTooLow`` in us-east-1b: launched in another zone, said as a spot
  price, not as the placement group's capacity (us-east-1a, still without capacity, is passed over in one more
  line).
"""

from __future__ import annotations

import json

import pytest
from ec2_refusals import PlacementGroups, RefusingProxy
from test_aws_moto import REGION, _instances, ec2, moto_clients, moto_url, offline_terraform, ssh_listener  # noqa: F401
from test_aws_replace import launch_zone

from multinode.core.config import ClusterSpec
from multinode.core.errors import CapacityRefused
from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration

ICE = ("InsufficientInstanceCapacity", "We currently do not have sufficient c6i.xlarge capacity in the Availability "
       "Zone you requested (us-east-1a).")
SPOT_COUNT = ("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded")
SPOT_PRICE = ("SpotMaxPriceTooLow", "Your Spot request price of 0.17 is lower than the minimum required Spot request "
              "fulfillment price of 0.2.")


class Zones:
    """The proxy's rule: refuses each RunInstances whose zone ``refuse`` names, with that zone's answer."""

    def __init__(self, ec2_client) -> None:
        self.ec2, self.refuse, self.launches = ec2_client, {}, []

    def __call__(self, fields):
        if fields.get("Action") != "RunInstances":
            return None
        zone = launch_zone(self.ec2, fields)
        answer = self.refuse.get(zone) or self.refuse.get("*")
        self.launches.append((zone, bool(fields.get("Placement.GroupName") or fields.get("Placement.GroupId")),
                              answer[1] if answer else None))
        return answer


def _zones_of(ec2_client, inventory) -> list[str]:
    found = {i["InstanceId"]: i for r in ec2_client.describe_instances(
        InstanceIds=[n.instance_id for n in inventory.nodes])["Reservations"] for i in r["Instances"]}
    return [ec2_client.describe_subnets(SubnetIds=[found[n.instance_id]["SubnetId"]])["Subnets"][0]["AvailabilityZone"]
            for n in inventory.nodes]


def test_a_zone_without_capacity_and_the_spot_errors(ec2, offline_terraform, moto_url, tmp_path, ssh_listener,
                                                    monkeypatch, capsys):
    zones, groups = Zones(ec2), PlacementGroups()
    zones.refuse["us-east-1a"] = (500, *ICE)  # the cluster's zone has no c6i.xlarge, in the group or not
    proxy = RefusingProxy(moto_url, zones, answer=groups)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("TF_VAR_placement_group", "true")  # the production default
    state = ClusterState.for_cluster("tfzone", root=tmp_path)
    spec = ClusterSpec(name="tfzone", provider="aws", nodes=2, options={
        "region": REGION, "ssh_cidr": "203.0.113.4/32", "owner": "alice", "spot": "1"})
    provider = AwsProvider(ssh_port=ssh_listener, wait_ssh=lambda hosts, port, timeout: aws_ec2.wait_tcp(
        ["127.0.0.1"] * len(hosts), port, timeout=timeout, poll=0.2), wait_ready=lambda inventory, image: None,
        clients=moto_clients)
    tfvars = lambda: json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())  # noqa: E731
    try:
        inv = provider.up(spec, state)
        said = [line for line in capsys.readouterr().err.splitlines() if "EC2 said" in line]
        assert said == [
            "node-0, node-1: no capacity in the cluster placement group (EC2 said InsufficientInstanceCapacity); "
            "launching them outside the group (same subnet and zone, less bandwidth to the others)",
            "node-0, node-1: no capacity in us-east-1a (EC2 said InsufficientInstanceCapacity); launching them in "
            "us-east-1b (outside the placement group, less bandwidth to the others)"]
        assert _zones_of(ec2, inv) == ["us-east-1b", "us-east-1b"]
        assert tfvars()["node_zones"] == {"0": "us-east-1b", "1": "us-east-1b"}
        vpc = ec2.describe_vpcs(Filters=[{"Name": "tag:cluster", "Values": ["tfzone"]}])["Vpcs"][0]["VpcId"]
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
        assert sorted(s["AvailabilityZone"] for s in subnets) == tfvars()["zones"] == [
            "us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]  # every zone offering c6i.xlarge
        assert {z for z, _grouped, refused in zones.launches if not refused} == {"us-east-1b"}

        before, layout = tfvars(), {k: tfvars()[k] for k in ("node_zones", "outside_placement_group")}
        zones.refuse["*"] = (400, *SPOT_COUNT)
        with pytest.raises(CapacityRefused) as err:
            provider.replace(state, inv, "node-1")
        assert str(err.value).startswith(
            "node-1: no replacement (EC2 said MaxSpotInstanceCountExceeded: the account's spot vCPU quota for "
            "c6i.xlarge in us-east-1 is used up; request an increase of 'All Standard (A, C, D, H, I, M, R, T, Z) "
            "Spot Instance Requests' (L-34B43A08) in the Service Quotas console")
        assert {k: tfvars()[k] for k in layout} == layout and tfvars()["zones"] == before["zones"]  # nothing moved
        assert "placement group" not in capsys.readouterr().err

        del zones.refuse["*"]
        zones.refuse["us-east-1b"] = (400, *SPOT_PRICE)
        after = provider.replace(state, inv, "node-1")
        said = [line for line in capsys.readouterr().err.splitlines() if "EC2 said" in line]
        assert said == [  # us-east-1a still has no capacity: the next zone after it
            "node-1: EC2 said SpotMaxPriceTooLow in us-east-1b: the spot price of the type in the zone is above the "
            "request's maximum price (the on-demand price unless one is set); launching it in us-east-1a",
            "node-1: no capacity in us-east-1a (EC2 said InsufficientInstanceCapacity); launching it in us-east-1c "
            "(outside the placement group, less bandwidth to the others)"]
        assert _zones_of(ec2, after) == ["us-east-1b", "us-east-1c"] and after.nodes[0] == inv.nodes[0]
        assert tfvars()["outside_placement_group"] == before["outside_placement_group"]
        zones.refuse.clear()
        lines = provider.down(state)
    finally:
        proxy.close()
    assert lines[-1].startswith("verified: no instance tagged cluster=tfzone") and groups.groups == {}
    assert {i["State"]["Name"] for i in _instances(ec2, "tfzone")} == {"terminated"}
