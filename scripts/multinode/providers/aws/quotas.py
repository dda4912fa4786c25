"""The account's vCPU quotas for EC2 instances: checked before ``up`` creates anything, and named when EC2 refuses.

A new account can usually run no GPU instance at all: EC2 counts the vCPUs of the running instances of each family
class against a regional quota, on-demand and spot apart, and refuses a launch beyond it (``VcpuLimitExceeded``,
``MaxSpotInstanceCountExceeded``: :mod:`multinode.providers.aws.refusals`). The quota codes (Service Quotas, service
code ``ec2``; the value is a number of vCPUs -- the AWS CLI reference's get-aws-default-service-quota example shows
L-1216C47A with ``UsageMetric`` ``Resource: vCPU``):

* L-DB2E81BA "Running On-Demand G and VT instances", L-3819A6DF "All G and VT Spot Instance Requests" (g4dn, g4ad);
* L-1216C47A "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", L-34B43A08 "All Standard (A, C, D, H,
  I, M, R, T, Z) Spot Instance Requests" (c6i and the other cpu types).

(AWS lists the codes in the Service Quotas console and ``aws service-quotas list-service-quotas --service-code ec2``;
the same four pairs are quoted by name and code in many public tools, e.g. the spot table of cloudsnorkel's
cloud-z collector.) :func:`check` reads the applied value (``GetServiceQuota``; a quota never changed has none, and
Service Quotas answers ``NoSuchResourceException``: then ``GetAWSDefaultServiceQuota``), adds the vCPUs of the
family's running instances, and refuses ``up`` in one line naming the quota and how to raise it. When the quota
cannot be read (no ``servicequotas:GetServiceQuota`` permission, a family not listed here) it says so in one line and
``up`` goes on: EC2's own refusal is then named the same way (:func:`refused`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from multinode.core.errors import UserError


@dataclass(frozen=True)
class Quota:
    code: str
    name: str


@dataclass(frozen=True)
class Family:
    """The instance types one pair of quotas counts (``pattern`` on the type's name)."""

    pattern: str
    on_demand: Quota
    spot: Quota


FAMILIES = (
    Family(r"^(g|vt)\d", Quota("L-DB2E81BA", "Running On-Demand G and VT instances"),
           Quota("L-3819A6DF", "All G and VT Spot Instance Requests")),
    Family(r"^[acdhimrtz]\d", Quota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
           Quota("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests")),
)


def family_of(instance_type: str) -> Family | None:
    return next((f for f in FAMILIES if re.match(f.pattern, instance_type)), None)


def quota_for(instance_type: str, spot: bool) -> Quota | None:
    family = family_of(instance_type)
    return None if family is None else (family.spot if spot else family.on_demand)


def how_to_raise(quota: Quota, region: str, desired: int | str) -> str:
    return (f"request an increase of '{quota.name}' ({quota.code}) in the Service Quotas console, or: aws "
            f"service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota.code} "
            f"--desired-value {desired} --region {region}")


@dataclass(frozen=True)
class Need:
    """What ``up`` asks of the account: ``nodes`` instances of ``instance_type`` in ``region``."""

    instance_type: str
    nodes: int
    spot: bool
    region: str


def refused(code: str, need: Need) -> str:
    """EC2 refused a launch for a quota (VcpuLimitExceeded, MaxSpotInstanceCountExceeded): the line that names it."""
    quota = quota_for(need.instance_type, need.spot)
    named = (how_to_raise(quota, need.region, "<vCPUs>") if quota
             else "request an increase of the family's vCPU quota in the Service Quotas console")
    return (f"EC2 said {code}: the account's {'spot' if need.spot else 'on-demand'} vCPU quota for "
            f"{need.instance_type} in {need.region} is used up; {named}")


def check(ec2, quotas, need: Need) -> None:
    """UserError when ``need`` does not fit the account's quota with what already runs (module doc); nothing is
    made either way. A quota that cannot be read is said in one line on stderr, and ``up`` goes on."""
    quota = quota_for(need.instance_type, need.spot)
    if quota is None:
        return
    try:
        each = vcpus(ec2, [need.instance_type])[need.instance_type]
        value = quota_value(quotas, quota.code)
        used = in_use(ec2, family_of(need.instance_type), need.spot)
    except Exception as err:  # noqa: BLE001 -- any of boto3's errors: the check is skipped, said, never fatal
        code = getattr(err, "response", {}).get("Error", {}).get("Code") or type(err).__name__
        print(f"the vCPU quota '{quota.name}' ({quota.code}) was not checked ({code}); EC2 refuses with "
              "VcpuLimitExceeded if it is too small", file=sys.stderr, flush=True)
        return
    wanted = need.nodes * each
    if used + wanted > value:
        raise UserError(f"make up needs {wanted} vCPUs of '{quota.name}' ({quota.code}) in {need.region} "
                        f"({need.nodes} x {need.instance_type}, {each} vCPUs each) with {used} in use, but the account's "
                        f"quota there is {value:g}; {how_to_raise(quota, need.region, used + wanted)}; then make up again")


def quota_value(quotas, code: str) -> float:
    """The applied value of an EC2 quota, or its default when it was never changed (NoSuchResourceException)."""
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except Exception as err:  # noqa: BLE001 -- botocore's ClientError, by its code
        if getattr(err, "response", {}).get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
    return float(quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])


def vcpus(ec2, types: list[str]) -> dict[str, int]:
    """{instance type: its default vCPUs} (DescribeInstanceTypes ``VCpuInfo.DefaultVCpus``)."""
    found = ec2.describe_instance_types(InstanceTypes=sorted(set(types)))["InstanceTypes"]
    return {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in found}


def in_use(ec2, family: Family, spot: bool) -> int:
    """vCPUs of the account's pending and running instances that ``family``'s quota counts (spot or on-demand)."""
    found = []
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            found += [i for i in reservation["Instances"] if re.match(family.pattern, i["InstanceType"])
                      and (i.get("InstanceLifecycle") == "spot") == spot]
    sizes = vcpus(ec2, [i["InstanceType"] for i in found]) if found else {}
    return sum(sizes[i["InstanceType"]] for i in found)


__all__ = ["FAMILIES", "Need", "Quota", "check", "family_of", "how_to_raise", "quota_for", "refused"]
