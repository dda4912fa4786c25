"""The AWS status wait really waits, and really times out, against moto's server on loopback.

moto puts a new instance straight into ``running`` with both status checks ``ok``, so a wait
against it never waits. Here moto's server runs in this process (``ThreadedMotoServer``: the same
HTTP server and EC2 models as ``moto_server``), which lets the test hold instances in ``pending`` --
the state every EC2 instance starts in -- by setting moto's own instance state; moto then answers
``DescribeInstanceStatus`` for them as EC2 does for a booting instance (checks ``not-applicable``).
The code under test only talks HTTP to that server. The polls are counted with botocore's
``after-call`` event (read only; the answers are moto's).
"""

from __future__ import annotations

import socket

import boto3
import pytest

from multinode.core.errors import NodeError
from multinode.providers.aws import ec2 as aws_ec2

pytestmark = pytest.mark.integration

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in images


@pytest.fixture(scope="module")
def moto():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()  # returns once the server accepts requests
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def ec2(moto, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto)


def _instances(ec2, count: int) -> list:
    """``count`` new instances, held in ``pending`` in moto's own model (as EC2 instances start)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=AMI, InstanceType="c6i.xlarge", MinCount=count,
                                                      MaxCount=count)["Instances"]]
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    instances = [backend.get_instance(i) for i in ids]
    for instance in instances:
        instance._state.name, instance._state.code = "pending", 0
    return instances


def _count_polls(ec2, on_poll=None) -> list[dict]:
    """Every DescribeInstanceStatus answer the code under test gets, in order."""
    seen: list[dict] = []

    def after(parsed, **_):
        seen.append({s["InstanceId"]: s["InstanceState"]["Name"] for s in parsed.get("InstanceStatuses", [])})
        if on_poll is not None:
            on_poll(len(seen))

    ec2.meta.events.register("after-call.ec2.DescribeInstanceStatus", after)
    return seen


def test_status_wait_times_out_on_instances_that_stay_pending(ec2):
    instances = _instances(ec2, 2)
    ids = [i.id for i in instances]
    polls = _count_polls(ec2)
    with pytest.raises(NodeError, match=rf"instances {ids[0]}, {ids[1]} did not pass their status checks within 1s"):
        aws_ec2.wait_status_ok(ec2, ids, timeout=1.0, poll=0.2)
    # It kept polling moto until the deadline (several polls, each seeing both still pending).
    assert len(polls) >= 3 and all(p == {i: "pending" for i in ids} for p in polls)


def test_status_wait_waits_for_pending_instances_then_returns(ec2):
    instances = _instances(ec2, 2)
    ids = [i.id for i in instances]

    def boot(n: int) -> None:  # after the 2nd poll the first instance is up; after the 4th, the second
        if n in (2, 4):
            instance = instances[n // 2 - 1]
            instance._state.name, instance._state.code = "running", 16

    polls = _count_polls(ec2, boot)
    aws_ec2.wait_status_ok(ec2, ids, timeout=60, poll=0.05)
    assert len(polls) == 5  # returned at the first poll that saw both running, not before, not later
    assert polls[0] == {ids[0]: "pending", ids[1]: "pending"}
    assert polls[2] == {ids[0]: "running", ids[1]: "pending"}
    assert polls[3:] == [{ids[1]: "pending"}, {ids[1]: "running"}]  # only the one still pending is asked about
