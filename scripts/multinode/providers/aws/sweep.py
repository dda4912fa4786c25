"""Delete everything infra/ec2 makes for a cluster, found by tags alone (no Terraform state needed).

``down`` runs it after ``terraform destroy`` (and instead of it when the local state is gone); ``reap``
runs it for clusters whose instances ended by their TTL, which leaves the VPC, subnet, internet
gateway, route table, security group, key pair, placement group, IAM role and instance profile and
ECR repository behind. A resource is ours when it carries ``managed-by=multinode`` and
``cluster=<name>`` (and ``cluster-id=<id>`` when the id is known: two clusters of one name in one
account are told apart by it). Order matters: instances first (they hold the network interfaces,
the security group, the profile), then the network from the inside out, then the account-wide names.

The ECR repository is deleted only when it was made for the cluster (it carries our tags; a
repository taken by name does not) and is empty, or when ``delete_images`` is set (``YES=1``).

A security group or subnet whose instances were just terminated can still hold their network interfaces for a
while (EC2 detaches and deletes them asynchronously): EC2 then refuses the delete with ``DependencyViolation``. Those
deletes are retried with a bounded back-off (:class:`Retry`), then the refusal is raised as it came.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import session as aws_session

log = logging.getLogger(__name__)

IAM_PATH = "/multinode/"


@dataclass(frozen=True)
class Target:
    """Which cluster to sweep: its name, and its id when known (else every cluster of that name)."""

    cluster: str
    cluster_id: str | None = None

    def filters(self) -> list[dict]:
        found = [{"Name": "tag:managed-by", "Values": ["multinode"]}, {"Name": "tag:cluster", "Values": [self.cluster]}]
        if self.cluster_id:
            found.append({"Name": "tag:cluster-id", "Values": [self.cluster_id]})
        return found

    def matches(self, tags: dict[str, str]) -> bool:
        return (tags.get("managed-by") == "multinode" and tags.get("cluster") == self.cluster
                and (self.cluster_id is None or tags.get("cluster-id") == self.cluster_id))

    def describe(self) -> str:
        return f"cluster={self.cluster}" + (f", cluster-id={self.cluster_id}" if self.cluster_id else "")


# "DependencyViolation: The specified object has dependent resources" (EC2 API error codes,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html); DeleteSecurityGroup answers it while a
# network interface still uses the group, DeleteSubnet while one is still in the subnet.
DEPENDENCY_VIOLATION = "DependencyViolation"


@dataclass(frozen=True)
class Retry:
    """Seconds to wait before each retry of a delete refused with DependencyViolation: 7 tries, 215 s of waiting at most."""

    delays: tuple[float, ...] = (5.0, 10.0, 20.0, 30.0, 60.0, 90.0)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def call(self, what: str, delete: Callable[[], Any]) -> None:
        """``delete()``, again after each delay while EC2 answers DependencyViolation; the last refusal is raised."""
        from botocore.exceptions import ClientError

        for delay in (*self.delays, None):
            try:
                delete()
                return
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") != DEPENDENCY_VIOLATION or delay is None:
                    raise
                log.info("%s still has dependent resources (network interfaces detaching); retrying in %.0f s",
                         what, delay)
                self.sleep(delay)


@dataclass
class Clients:
    """The three AWS APIs a cluster spans."""

    ec2: Any
    iam: Any
    ecr: Any
    # False only against an endpoint without the placement group API (moto_server, in the tests; the
    # Terraform tests there create no placement group either).
    placement_groups: bool = True
    retry: Retry = field(default_factory=Retry)  # deletes refused with DependencyViolation

    @classmethod
    def for_region(cls, region: str, placement_groups: bool = True) -> "Clients":
        return cls(ec2=aws_session.client("ec2", region), iam=aws_session.client("iam", region),
                   ecr=aws_session.client("ecr", region), placement_groups=placement_groups)


def _tags(items: list[dict] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or []}


def sweep(clients: Clients, target: Target, delete_images: bool = False) -> list[str]:
    """Delete every resource of ``target``; one line per deleted (or kept) resource."""
    lines: list[str] = []
    for step in STEPS:
        lines.extend(step(clients, target, delete_images))
    return lines


def _instances(c: Clients, t: Target, _: bool) -> list[str]:
    found = [i for i in aws_ec2.tagged_instances(c.ec2, t.cluster) if t.cluster_id in (None, i.cluster_id)]
    if not found:
        return []
    aws_ec2.terminate(c.ec2, [i.instance_id for i in found])
    return [f"terminated instance {i.instance_id}" for i in found]


def _network(c: Clients, t: Target, _: bool) -> list[str]:
    lines = []
    # Security groups first: in our VPCs or (vpc_id given) in someone else's, found by tag.
    # (A VPC's default group carries our tags too; it goes with its VPC and cannot be deleted alone.)
    def delete_group(sg: dict) -> None:
        c.retry.call(f"security group {sg['GroupId']}", lambda: c.ec2.delete_security_group(GroupId=sg["GroupId"]))
        lines.append(f"deleted security group {sg['GroupId']} ({sg['GroupName']})")

    for sg in c.ec2.describe_security_groups(Filters=t.filters())["SecurityGroups"]:
        if sg["GroupName"] != "default":
            delete_group(sg)
    for vpc in c.ec2.describe_vpcs(Filters=t.filters())["Vpcs"]:
        vpc_id = vpc["VpcId"]
        in_vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]
        for sg in c.ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]:
            if sg["GroupName"] != "default":
                delete_group(sg)
        for subnet in c.ec2.describe_subnets(Filters=in_vpc)["Subnets"]:
            c.retry.call(f"subnet {subnet['SubnetId']}", lambda s=subnet["SubnetId"]: c.ec2.delete_subnet(SubnetId=s))
            lines.append(f"deleted subnet {subnet['SubnetId']}")
        for table in c.ec2.describe_route_tables(Filters=in_vpc)["RouteTables"]:
            if any(a.get("Main") for a in table.get("Associations", [])):
                continue  # the VPC's main table goes with the VPC
            for assoc in table.get("Associations", []):
                c.ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
            c.ec2.delete_route_table(RouteTableId=table["RouteTableId"])
            lines.append(f"deleted route table {table['RouteTableId']}")
        igws = c.ec2.describe_internet_gateways(Filters=[{"Name": "attachment.vpc-id", "Values": [vpc_id]}])
        for igw in igws["InternetGateways"]:
            # Refused too while the VPC still has mapped public addresses (instances' interfaces going away).
            c.retry.call(f"internet gateway {igw['InternetGatewayId']}", lambda g=igw["InternetGatewayId"]:
                         c.ec2.detach_internet_gateway(InternetGatewayId=g, VpcId=vpc_id))
            c.ec2.delete_internet_gateway(InternetGatewayId=igw["InternetGatewayId"])
            lines.append(f"deleted internet gateway {igw['InternetGatewayId']}")
        c.retry.call(f"VPC {vpc_id}", lambda v=vpc_id: c.ec2.delete_vpc(VpcId=v))
        lines.append(f"deleted VPC {vpc_id}")
    return lines


def _key_pairs(c: Clients, t: Target, _: bool) -> list[str]:
    lines = []
    for key in c.ec2.describe_key_pairs(Filters=t.filters())["KeyPairs"]:
        c.ec2.delete_key_pair(KeyName=key["KeyName"])
        lines.append(f"deleted key pair {key['KeyName']}")
    return lines


def _placement_groups(c: Clients, t: Target, _: bool) -> list[str]:
    if not c.placement_groups:
        return []
    lines = []
    for group in c.ec2.describe_placement_groups(Filters=t.filters())["PlacementGroups"]:
        c.ec2.delete_placement_group(GroupName=group["GroupName"])
        lines.append(f"deleted placement group {group['GroupName']}")
    return lines


def _iam(c: Clients, t: Target, _: bool) -> list[str]:
    lines = []
    for page in c.iam.get_paginator("list_roles").paginate(PathPrefix=IAM_PATH):
        for role in page["Roles"]:
            name = role["RoleName"]
            if not t.matches(_tags(c.iam.list_role_tags(RoleName=name)["Tags"])):
                continue
            for profile in c.iam.list_instance_profiles_for_role(RoleName=name)["InstanceProfiles"]:
                c.iam.remove_role_from_instance_profile(InstanceProfileName=profile["InstanceProfileName"], RoleName=name)
                c.iam.delete_instance_profile(InstanceProfileName=profile["InstanceProfileName"])
                lines.append(f"deleted instance profile {profile['InstanceProfileName']}")
            for policy in c.iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
                c.iam.detach_role_policy(RoleName=name, PolicyArn=policy["PolicyArn"])
            for policy in c.iam.list_role_policies(RoleName=name)["PolicyNames"]:
                c.iam.delete_role_policy(RoleName=name, PolicyName=policy)
            c.iam.delete_role(RoleName=name)
            lines.append(f"deleted IAM role {name}")
    return lines


def _ecr(c: Clients, t: Target, delete_images: bool) -> list[str]:
    lines = []
    for page in c.ecr.get_paginator("describe_repositories").paginate():
        for repo in page["repositories"]:
            if not t.matches(_tags(c.ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"])["tags"])):
                continue  # not made for this cluster (e.g. taken by name): never ours to delete
            name = repo["repositoryName"]
            images = len(c.ecr.list_images(repositoryName=name)["imageIds"])
            if images and not delete_images:
                lines.append(f"kept ECR repository {name}: it holds {images} images (YES=1 deletes it with them)")
                continue
            c.ecr.delete_repository(repositoryName=name, force=bool(images))
            lines.append(f"deleted ECR repository {name}" + (f" and its {images} images" if images else ""))
    return lines


STEPS: tuple[Callable[[Clients, Target, bool], list[str]], ...] = (
    _instances, _network, _key_pairs, _placement_groups, _iam, _ecr)


def leftover_targets(clients: Clients, cluster: str | None = None) -> list[Target]:
    """(cluster, cluster-id) of every tagged VPC, security group or key pair: what a reap may sweep."""
    base = [{"Name": "tag:managed-by", "Values": ["multinode"]}]
    if cluster:
        base.append({"Name": "tag:cluster", "Values": [cluster]})
    found: set[tuple[str, str | None]] = set()
    for items in (clients.ec2.describe_vpcs(Filters=base)["Vpcs"],
                  clients.ec2.describe_security_groups(Filters=base)["SecurityGroups"],
                  clients.ec2.describe_key_pairs(Filters=base)["KeyPairs"]):
        for item in items:
            tags = _tags(item.get("Tags"))
            found.add((tags.get("cluster", "?"), tags.get("cluster-id")))
    return [Target(name, cid) for name, cid in sorted(found, key=lambda f: (f[0], f[1] or ""))]
