"""The readiness wait of `up` against REAL SSH nodes: a local cluster (network namespaces, one sshd
each) stands in for EC2 instances. Each node's bootstrap reports in files of its own directory
(``{node}`` in the paths), and a stand-in ``cloud-init`` prints what Ubuntu's prints when it is done.

(a) a node whose ready marker never appears: the wait fails within its deadline naming the node, with
    the tail of its bootstrap log; the AWS provider's ``up`` (against moto_server) then destroys;
(b) a node whose marker is written late by a background process on the node: the wait succeeds;
(c) a node whose bootstrap failed: the wait stops at once, long before its deadline.
"""

from __future__ import annotations

import io
import shlex

import pytest
from localcluster import bring_up, tear_down
from test_aws_moto import FakeTerraform, _spec, ec2, moto_clients, moto_url, ssh_listener  # noqa: F401 (fixtures)

from multinode.core.errors import NodeError
from multinode.core.progress import Progress
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.provider import AwsProvider
from multinode.providers.aws.readiness import Bootstrap, wait_ready
from multinode.ssh.runner import RemoteRunner
from multinode.core.state import ClusterState

pytestmark = pytest.mark.integration

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-rd:cpu"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), 2, prefix="rd")
    try:
        yield cluster
    finally:
        tear_down(cluster)


@pytest.fixture
def boot(tmp_path, cluster) -> Bootstrap:
    """Per-node bootstrap files under tmp_path; node-0 ready, every node with a bootstrap log."""
    cloud_init = tmp_path / "cloud-init"
    cloud_init.write_text("#!/bin/sh\necho 'status: done'\n")
    cloud_init.chmod(0o755)
    for node in ("node-0", "node-1"):
        (tmp_path / node).mkdir()
        (tmp_path / node / "bootstrap.log").write_text(
            "".join(f"{node} bootstrap step {i}\n" for i in range(40)) + f"{node}: docker pull {IMAGE}: pulling\n")
    (tmp_path / "node-0" / "ready").write_text(f"image={IMAGE}\ngpus=0\n")
    return Bootstrap(ready=f"{tmp_path}/{{node}}/ready", failed=f"{tmp_path}/{{node}}/failed",
                     log=f"{tmp_path}/{{node}}/bootstrap.log", cloud_init=str(cloud_init), tail_lines=5)


def test_a_node_that_never_becomes_ready_fails_within_the_deadline_with_its_log_tail(cluster, boot):
    inv = cluster.inventory()
    with RemoteRunner(inv) as runner:
        with pytest.raises(NodeError) as err:
            wait_ready(inv, runner, image=IMAGE, timeout=6, bootstrap=boot, poll=1)
    assert err.value.node == "node-1" and "not ready within 6s: no ready marker" in err.value.message
    assert err.value.tail == [f"node-1 bootstrap step {i}" for i in range(36, 40)] + [f"node-1: docker pull {IMAGE}: pulling"]
    assert str(err.value).startswith("node-1: not ready within 6s") and "last lines of node-1:" in str(err.value)


def test_a_node_that_becomes_ready_late_is_waited_for(cluster, boot, tmp_path):
    inv = cluster.inventory()
    marker = tmp_path / "node-1" / "ready"
    # On node-1, a background process finishes "the bootstrap" 3 s from now (temp file + rename, as the real one).
    late = (f"sleep 3; printf 'image=%s\\ngpus=0\\n' {shlex.quote(IMAGE)} > {marker}.tmp; mv {marker}.tmp {marker}")
    with RemoteRunner(inv) as runner:
        started = runner.run_on("node-1", f"nohup sh -c {shlex.quote(late)} >/dev/null 2>&1 &")
        assert started.ok, started
        assert not marker.exists()  # not ready when the wait begins
        said: list[str] = []
        shown = io.StringIO()  # not a terminal: a plain line each time the progress changes
        wait_ready(inv, runner, image=IMAGE, timeout=60, bootstrap=boot, poll=0.5, say=said.append,
                   progress=Progress("bootstrap", shown))
    assert marker.exists()  # it returned once the marker was there (absent when the wait began)
    assert said[0].startswith("node-0 is ready") and said[-1].startswith("node-1 is ready")
    # while node-1 waited: how many nodes were ready, and the step its bootstrap log had reached
    assert shown.getvalue().splitlines()[0] == (f"bootstrap: 1/2 node(s) ready; node-1: no ready marker {marker} yet "
                                                f"(bootstrap: node-1: docker pull {IMAGE}: pulling)"), shown.getvalue()
    assert "\r" not in shown.getvalue()


def test_a_failed_bootstrap_ends_the_wait_at_once(cluster, boot, tmp_path):
    inv = cluster.inventory()
    (tmp_path / "node-1" / "failed").write_text("line 88 exit 100: apt_get install amdgpu-dkms\n")
    with RemoteRunner(inv) as runner:
        with pytest.raises(NodeError) as err:
            wait_ready(inv, runner, image=IMAGE, timeout=300, bootstrap=boot, poll=1)
    assert err.value.node == "node-1"
    assert err.value.message == "bootstrap failed: the bootstrap failed: line 88 exit 100: apt_get install amdgpu-dkms"
    assert err.value.tail[-1] == f"node-1: docker pull {IMAGE}: pulling"


def test_a_marker_of_another_image_is_a_failure(cluster, boot, tmp_path):
    inv = cluster.inventory()
    (tmp_path / "node-1" / "ready").write_text("image=multinode-cpu:latest\ngpus=0\n")
    with RemoteRunner(inv) as runner, pytest.raises(NodeError) as err:
        wait_ready(inv, runner, image=IMAGE, timeout=60, bootstrap=boot, poll=1)
    assert err.value.node == "node-1" and f"not '{IMAGE}'" in err.value.message


def test_aws_up_destroys_when_the_wait_fails(cluster, boot, ec2, tmp_path, ssh_listener):  # noqa: F811
    """The AWS provider's `up` against moto_server, its readiness wait on the local nodes (node-1 never
    ready): the NodeError of the wait reaches the user and everything `up` made is destroyed."""
    local = cluster.inventory()
    state = ClusterState.for_cluster("rdaws", root=tmp_path / "home")
    terraform = FakeTerraform(ec2, "127.0.0.1")

    def wait_on_local_nodes(inventory, image):
        assert [n.name for n in inventory.nodes] == [n.name for n in local.nodes]
        with RemoteRunner(local) as runner:
            wait_ready(local, runner, image=IMAGE, timeout=5, bootstrap=boot, poll=1)

    provider = AwsProvider(terraform=terraform, ec2_client=lambda region: ec2, ssh_port=ssh_listener,
                           wait_ready=wait_on_local_nodes, clients=moto_clients)
    with pytest.raises(NodeError) as err:
        provider.up(_spec("rdaws"), state)
    assert err.value.node == "node-1" and "not ready within 5s" in err.value.message and err.value.tail
    assert terraform.calls[-1] == "destroy"
    assert aws_ec2.tagged_instances(ec2, "rdaws") == [] and not state.inventory_path.exists()
    assert not (state.provider_dir / "aws.json").exists()
