"""Recovery of an EC2 cluster's lost node, against a real moto_server (test_aws_moto's fixtures; never AWS):

* wait or shrink by the cluster's own launch times: the record ``up`` and each replacement keep (instances made in
  moto, their launch-to-ready seconds recorded), the median as the provider's estimate, the decision and the words
  that print it; a published figure before there is a record (issue 47 item 1);
* an error of boto3's own inside a replacement (EC2 throttling DescribeInstances after botocore's retries,
  ``RequestLimitExceeded`` answered by ec2_refusals.RefusingProxy in EC2's error document) is one line, and the run
  goes on with the nodes it has -- before, the replacement's thread died and the run's wait raised KeyError (item 2);
* every thread asks EC2 through a session of its own (boto3's sessions are not thread safe).
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from ec2_refusals import RefusingProxy
from test_aws_moto import AMI, REGION, ec2, moto_url  # noqa: F401

from multinode.app.recover import Loss, Recovery
from multinode.app.replacements import wait_seconds
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory, Node
from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import launches
from multinode.providers.aws import session as aws_session
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration


def _cluster(ec2_client, state: ClusterState, n: int = 3) -> Inventory:
    """``n`` instances in moto and the inventory the provider would have written for them."""
    reply = ec2_client.run_instances(ImageId=AMI, InstanceType="c6i.xlarge", MinCount=n, MaxCount=n)
    nodes = tuple(Node(name=f"node-{i}", hostname=f"rec-node-{i}", private_ip=inst["PrivateIpAddress"], ssh_user="ubuntu",
                       ssh_port=22, host_key="ssh-ed25519 AAAAtest", instance_id=inst["InstanceId"])
                  for i, inst in enumerate(reply["Instances"]))
    state.provider_dir.mkdir(parents=True, exist_ok=True)
    (state.provider_dir / "aws.json").write_text(json.dumps({"region": REGION, "cluster": "rec", "cluster_id": "abcdef"}))
    (state.provider_dir / "terraform").mkdir()
    (state.provider_dir / "terraform" / "terraform.tfvars.json").write_text(json.dumps({"ami_id": AMI, "ttl_hours": 8}))
    return Inventory(cluster="rec", provider="aws", nodes=nodes, subnet="10.0.0.0/8", ssh_key=str(state.ssh_key),
                     known_hosts=str(state.known_hosts), workdir="/opt/multinode",
                     extra={"instance_types": ["c6i.xlarge"], "region": REGION})


class Held(AwsProvider):
    """The real provider, its replacement held until the test releases it (the estimate is what is tested)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.asked, self.release = [], threading.Event()

    def replace(self, state, inventory, name, retire=None):
        self.asked.append(name)
        self.release.wait(30)
        return inventory


def test_recovery_on_ec2_weighs_a_replacement_by_the_clusters_own_launches(ec2, tmp_path):
    state = ClusterState.for_cluster("rec", root=tmp_path)
    cluster = _cluster(ec2, state)
    provider = Held(ec2_client=lambda region: ec2)
    # Before any launch is on record: a published lower bound, said as one.
    assert provider.replacement_estimate(state, cluster) == launches.PUBLISHED
    # Recorded times: ready 250, 240 and 260 s after EC2's own LaunchTime of each instance.
    launched = {i["InstanceId"]: i["LaunchTime"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    for node, seconds in zip(cluster.nodes, (250, 240, 260)):
        launches.record(state.provider_dir, ec2, [node], "up", launched[node.instance_id] + timedelta(seconds=seconds))
    assert [s["seconds"] for s in launches.read(state.provider_dir)] == [250.0, 240.0, 260.0]
    estimate = provider.replacement_estimate(state, cluster)
    assert (estimate.seconds, estimate.basis) == (250.0, "measured: median of 3 launches of c6i.xlarge in this cluster")

    said: list[str] = []
    rec = Recovery(state, cluster, LaunchSpec(nodes=3, recover=1, recover_wait=300, grace=30), said.append,
                   provider=provider)
    rec.restart_seconds = 40.0  # the run's own restart: a replacement (250 s) costs more: go on at once, grow back
    wait = wait_seconds(estimate.seconds, rec.restart_seconds, rec.spec.recover_wait)
    assert wait == 0.0
    active = rec._replace_or_shrink(rec.cluster, Loss(["node-2"], "lost", 7), wait)  # without the 300 s wait
    provider.release.set()
    assert [n.name for n in active.nodes] == ["node-0", "node-1"] and provider.asked == ["node-2"]
    line = ("it takes about 250 s (measured: median of 3 launches of c6i.xlarge in this cluster), longer than a "
            "restart of the job, about 40 s: going on without it at once")
    assert line in "\n".join(said)
    assert rec.timeline.events[0]["event"] == "replacement asked" and line in rec.timeline.events[0]["detail"]


def test_an_ec2_error_inside_a_replacement_is_one_line_and_the_run_goes_on(ec2, moto_url, tmp_path, monkeypatch):
    state = ClusterState.for_cluster("rec", root=tmp_path)
    cluster = _cluster(ec2, state)
    throttled = RefusingProxy(moto_url, lambda f: (503, "RequestLimitExceeded", "Request limit exceeded.")
                              if f.get("Action") == "DescribeInstances" else None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", throttled.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own retries, kept short
    said: list[str] = []
    try:
        rec = Recovery(state, cluster, LaunchSpec(nodes=3, recover=1, recover_wait=60, grace=30), said.append,
                       provider=AwsProvider())  # the real replace: billing() asks DescribeInstances first
        active = rec._replace_or_shrink(rec.cluster, Loss(["node-1"], "lost", 7), rec.spec.recover_wait)
    finally:
        throttled.close()
    assert [n.name for n in active.nodes] == ["node-0", "node-2"]
    assert throttled.refused and all(code == "RequestLimitExceeded" for _action, code in throttled.refused)
    (gone,) = [line for line in said if line.startswith("node-1: the replacement failed")]
    assert gone.startswith("node-1: the replacement failed: ClientError: An error occurred (RequestLimitExceeded) when "
                           "calling the DescribeInstances operation") and "\n" not in gone
    assert gone.endswith("; going on with 2 node(s) at the same global batch")
    assert rec.timeline.events[-1]["event"] == "going on without it"


def test_each_thread_asks_ec2_through_a_session_of_its_own(ec2):
    made: dict[str, tuple[object, object]] = {}  # the sessions themselves: kept alive, their ids stay unique

    def ask(name: str) -> None:
        first, second = aws_session.session(), aws_session.session()
        aws_ec2.not_running(aws_ec2.client(REGION), ["i-00000000000000000"])  # a real call, from this thread
        made[name] = (first, second)

    threads = [threading.Thread(target=ask, args=(f"t{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # each does one quick call; botocore times its own reads out
    assert len(made) == 6 and all(a is b for a, b in made.values())  # kept within a thread
    assert len({id(a) for a, _ in made.values()}) == 6  # never shared between threads (the default session was)
