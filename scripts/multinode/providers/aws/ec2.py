"""boto3 glue for the AWS provider: find, wait for and terminate the instances of a cluster.

Every function takes an EC2 client as its first argument, so tests point it at a
``moto_server`` on loopback and the provider at the real region. Instances are found by tag
only (``managed-by=multinode`` and ``cluster=<name>``): that is what ``down`` verifies and
``reap`` sweeps, whatever Terraform's state says.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from multinode.core.errors import NodeError
from multinode.providers.aws import session as aws_session

log = logging.getLogger(__name__)

MANAGED_BY = ("managed-by", "multinode")
# A stopped instance bills no compute, but its EBS volumes still bill: it is a leak too.
BILLING_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
DEAD_STATES = ("shutting-down", "terminated", "stopping", "stopped")


@dataclass(frozen=True)
class TaggedInstance:
    instance_id: str
    state: str
    cluster: str
    owner: str
    expiry: str
    instance_type: str
    cluster_id: str | None = None  # the cluster-id tag: tells apart two clusters of one name

    def describe(self) -> str:
        return (f"{self.instance_id} {self.state:13} cluster={self.cluster} owner={self.owner} "
                f"expiry={self.expiry} {self.instance_type}")


def client(region: str):
    """An EC2 client for ``region``, from this thread's own session (:mod:`multinode.providers.aws.session`: the
    gone-poll and a replacement ask EC2 from two threads at once); boto3 honours AWS_ENDPOINT_URL(_EC2)."""
    return aws_session.client("ec2", region)


def offered_zones(ec2, instance_type: str) -> list[str]:
    """The zones of the client's region that offer ``instance_type`` (DescribeInstanceTypeOfferings), by name."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return sorted({o["Location"] for page in pages for o in page["InstanceTypeOfferings"]})


def tagged_instances(ec2, cluster: str | None = None, states: Sequence[str] = BILLING_STATES) -> list[TaggedInstance]:
    """Instances tagged managed-by=multinode (and cluster=<cluster> when given) in ``states``."""
    filters = [{"Name": f"tag:{MANAGED_BY[0]}", "Values": [MANAGED_BY[1]]},
               {"Name": "instance-state-name", "Values": list(states)}]
    if cluster is not None:
        filters.append({"Name": "tag:cluster", "Values": [cluster]})
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                found.append(TaggedInstance(
                    instance_id=inst["InstanceId"], state=inst["State"]["Name"],
                    cluster=tags.get("cluster", "?"), owner=tags.get("owner", "?"),
                    expiry=tags.get("expiry", "?"), instance_type=inst["InstanceType"],
                    cluster_id=tags.get("cluster-id")))
    return sorted(found, key=lambda i: (i.cluster, i.instance_id))


def wait_status_ok(ec2, instance_ids: Sequence[str], timeout: float, poll: float = 10.0) -> None:
    """Wait until every instance is running with both status checks (system, instance) ``ok``.

    Fails at once when an instance dies on the way (spot capacity, a bad AMI), and with the
    instances still not ready when ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    pending = list(instance_ids)
    while True:
        statuses = ec2.describe_instance_status(InstanceIds=pending, IncludeAllInstances=True)["InstanceStatuses"]
        ready = []
        for status in statuses:
            iid, state = status["InstanceId"], status["InstanceState"]["Name"]
            if state in DEAD_STATES:
                raise NodeError(iid, "wait for status checks", None, f"instance {iid} is {state} instead of running")
            if (state == "running" and status["SystemStatus"]["Status"] == "ok"
                    and status["InstanceStatus"]["Status"] == "ok"):
                ready.append(iid)
        pending = [i for i in pending if i not in ready]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise NodeError(pending[0], "wait for status checks", None,
                            f"instances {', '.join(pending)} did not pass their status checks within {timeout:.0f}s")
        log.info("waiting for status checks of %s", ", ".join(pending))
        time.sleep(poll)


def wait_tcp(hosts: Iterable[str], port: int, timeout: float, poll: float = 2.0) -> None:
    """Wait until every host accepts a TCP connection on ``port`` (sshd is up)."""
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending:
        for host in list(pending):
            try:
                with socket.create_connection((host, port), timeout=min(poll, 5.0)):
                    pending.remove(host)
            except OSError:
                pass
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise NodeError(pending[0], f"connect to port {port}", None,
                            f"{', '.join(pending)} did not accept connections on port {port} within {timeout:.0f}s")
        time.sleep(poll)


def terminate(ec2, instance_ids: Sequence[str], timeout: float = 600.0) -> None:
    """Terminate instances and wait until they are gone (terminated instances bill nothing)."""
    if not instance_ids:
        return
    ec2.terminate_instances(InstanceIds=list(instance_ids))
    ec2.get_waiter("instance_terminated").wait(
        InstanceIds=list(instance_ids), WaiterConfig={"Delay": 5, "MaxAttempts": max(1, int(timeout // 5))})


def billing(ec2, instance_ids: Sequence[str]) -> list[str]:
    """The ones of ``instance_ids`` that still exist in a billing state (a lost instance may still run)."""
    if not instance_ids:
        return []
    reply = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": list(instance_ids)},
                                            {"Name": "instance-state-name", "Values": list(BILLING_STATES)}])
    return sorted(i["InstanceId"] for r in reply["Reservations"] for i in r["Instances"])


def not_running(ec2, instance_ids: Sequence[str]) -> dict[str, str]:
    """{id: its state} for those of ``instance_ids`` that are not pending or running (gone, or going), as EC2 says;
    an id EC2 no longer lists is "terminated"."""
    if not instance_ids:
        return {}
    reply = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": list(instance_ids)}])
    states = {i["InstanceId"]: i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]}
    return {iid: states.get(iid, "terminated") for iid in instance_ids
            if states.get(iid, "terminated") not in ("pending", "running")}


def state_reason(ec2, instance_id: str) -> str:
    """Why the instance is in its state, as EC2 says (``Server.InsufficientInstanceCapacity: ...``), or ""."""
    reply = ec2.describe_instances(InstanceIds=[instance_id])
    for reservation in reply["Reservations"]:
        for inst in reservation["Instances"]:
            reason = inst.get("StateReason") or {}
            return ": ".join(part for part in (reason.get("Code"), reason.get("Message")) if part)
    return ""
