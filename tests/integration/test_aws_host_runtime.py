"""`make up PROVIDER=aws` with no IMAGE_REF (issue 27 item 10: no registry dance), the real terraform and AWS
provider against moto_server: `up` is not refused, the instances carry the host-runtime bootstrap (pinned
torch of the kind, docker/requirements.txt, the GPU smoke test on GPU kinds) in their user data, and the
inventory runs jobs on the nodes' virtualenv. What that bootstrap does on an instance: test_bootstrap_runtime.py
(local nodes) and docs/verification.md (what only AWS can show).
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from test_aws_moto import ec2, moto_clients, moto_url, offline_terraform, ssh_listener  # noqa: F401 (fixtures)

from multinode.core.config import ClusterSpec
from multinode.core.state import ClusterState
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws.bootstrap_inputs import host_requirements
from multinode.providers.aws.provider import AwsProvider

pytestmark = pytest.mark.integration


def test_up_without_an_image_makes_a_host_runtime_cluster(ec2, offline_terraform, tmp_path, ssh_listener,  # noqa: F811
                                                          monkeypatch):
    monkeypatch.delenv("MULTINODE_IMAGE", raising=False)
    state = ClusterState.for_cluster("hostrt", root=tmp_path)
    waited: list = []
    provider = AwsProvider(ssh_port=ssh_listener, clients=moto_clients, wait_ready=lambda inv, image: waited.append(image),
                           wait_ssh=lambda hosts, port, timeout: aws_ec2.wait_tcp(["127.0.0.1"] * len(hosts), port,
                                                                                  timeout=timeout, poll=0.2))
    spec = ClusterSpec(name="hostrt", provider="aws", nodes=1, cluster_type="g4dn",
                       options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", "owner": "alice"})
    inv = provider.up(spec, state)
    try:
        tfvars = json.loads((state.provider_dir / "terraform" / "terraform.tfvars.json").read_text())
        assert "image" not in tfvars and tfvars["host_requirements"] == host_requirements()
        assert (inv.runtime, inv.image, inv.interpreter) == ("host", None, "/opt/multinode/venv/bin/python")
        assert waited == [None]  # the readiness wait expects no image in the ready marker
        user_data = ec2.describe_instance_attribute(InstanceId=inv.nodes[0].instance_id, Attribute="userData")
        raw = base64.b64decode(user_data["UserData"]["Value"])
        assert len(raw) <= 16384  # EC2's user data limit: 16 KB raw, before base64 (AWS EC2 User Guide, "user data")
        cloud_config = yaml.safe_load(raw)
        script = cloud_config["write_files"][0]["content"]
        assert 'pip_install --index-url "https://pypi.org/simple" "torch==2.13.0"' in script
        assert "docker pull" not in script and 'image=""' in script
        assert "def report(**kw):" in script  # the GPU smoke test ends a g4dn bootstrap
    finally:
        provider.down(state)
    assert aws_ec2.tagged_instances(ec2, "hostrt") == []
