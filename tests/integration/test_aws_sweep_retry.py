"""Issue 37 item 5: the sweep (``down``, ``reap``) retries a security group's or subnet's delete that EC2 refuses with
``DependencyViolation`` (network interfaces of just-terminated instances detach asynchronously), within a bound.

Real moto_server (test_aws_moto's fixture) behind ec2_refusals.RefusingProxy, which answers the first deletes with
EC2's own error document, so boto3 parses a real refusal; the back-off's sleeps are recorded, not slept.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from ec2_refusals import RefusingProxy, first_n
from test_aws_moto import REGION, ec2, moto_url  # noqa: F401

from multinode.providers.aws import sweep as aws_sweep

pytestmark = pytest.mark.integration

# The messages EC2 gives with the code (as seen in public reports; only the code is documented, errors-overview.html).
SG_IN_USE = "resource {id} has a dependent object"
SUBNET_IN_USE = "The subnet '{id}' has dependencies and cannot be deleted."


def _cluster_network(ec2_client, cluster: str) -> tuple[str, str, str]:
    tags = [{"Key": "managed-by", "Value": "multinode"}, {"Key": "cluster", "Value": cluster}]
    vpc = ec2_client.create_vpc(CidrBlock="10.43.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": tags}])
    vpc_id = vpc["Vpc"]["VpcId"]
    subnet = ec2_client.create_subnet(VpcId=vpc_id, CidrBlock="10.43.1.0/24",
                                      TagSpecifications=[{"ResourceType": "subnet", "Tags": tags}])["Subnet"]["SubnetId"]
    group = ec2_client.create_security_group(GroupName=f"{cluster}-nodes", Description="nodes", VpcId=vpc_id,
                                             TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}])
    return vpc_id, subnet, group["GroupId"]


def _clients(url: str, slept: list) -> aws_sweep.Clients:
    make = lambda service: boto3.client(service, region_name=REGION, endpoint_url=url)  # noqa: E731
    return aws_sweep.Clients(ec2=make("ec2"), iam=make("iam"), ecr=make("ecr"), placement_groups=False,
                             retry=aws_sweep.Retry(sleep=slept.append))


def test_a_delete_refused_while_interfaces_detach_is_retried_and_the_network_goes(ec2, moto_url):
    vpc_id, subnet, group = _cluster_network(ec2, "sw1")
    rule = first_n({"DeleteSecurityGroup": 2}, "DependencyViolation", SG_IN_USE)
    subnet_rule = first_n({"DeleteSubnet": 3}, "DependencyViolation", SUBNET_IN_USE)
    proxy = RefusingProxy(moto_url, lambda fields: rule(fields) or subnet_rule(fields))
    slept: list = []
    try:
        lines = aws_sweep.sweep(_clients(proxy.url, slept), aws_sweep.Target("sw1"))
    finally:
        proxy.close()
    assert proxy.refused == [("DeleteSecurityGroup", "DependencyViolation")] * 2 + [
        ("DeleteSubnet", "DependencyViolation")] * 3
    assert slept == [5.0, 10.0, 5.0, 10.0, 20.0]  # each delete's own back-off
    assert f"deleted security group {group} (sw1-nodes)" in lines and f"deleted subnet {subnet}" in lines
    assert f"deleted VPC {vpc_id}" in lines
    assert ec2.describe_vpcs(VpcIds=[])["Vpcs"] == [v for v in ec2.describe_vpcs()["Vpcs"] if v["VpcId"] != vpc_id]


def test_a_refusal_that_outlasts_the_back_off_is_raised_as_ec2_said_it(ec2, moto_url):
    _, _, group = _cluster_network(ec2, "sw2")
    proxy = RefusingProxy(moto_url, first_n({"DeleteSecurityGroup": 99}, "DependencyViolation", SG_IN_USE))
    slept: list = []
    try:
        with pytest.raises(ClientError) as err:
            aws_sweep.sweep(_clients(proxy.url, slept), aws_sweep.Target("sw2"))
    finally:
        proxy.close()
    assert err.value.response["Error"]["Code"] == "DependencyViolation" and group in str(err.value)
    assert slept == list(aws_sweep.Retry().delays) and sum(slept) <= 240  # bounded: 7 tries, 215 s of waiting
    assert proxy.calls["DeleteSecurityGroup"] == len(aws_sweep.Retry().delays) + 1
