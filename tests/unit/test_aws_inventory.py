"""AWS provider, pure parts: terraform output -> Inventory, known_hosts, settings errors, cost line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from multinode.core.config import ClusterSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.providers.aws.keys import new_ed25519
from multinode.providers.aws.settings import (ROOT_VOLUME_GB, AwsSettings, cost_line, ecr_repository_of, prices_path,
                                              registry_of)
from multinode.providers.aws.terraform import inventory_from_outputs, known_hosts_lines
from multinode.core.state import ClusterState

# What `terraform output -json` prints for infra/ec2 (2 x g4dn.xlarge), trimmed of nothing.
OUTPUTS = {
    "inventory": {
        "sensitive": False,
        "type": ["object", {"cluster": "string", "region": "string", "subnet_cidr": "string", "ssh_user": "string",
                            "nodes": ["tuple", [["object", {}], ["object", {}]]]}],
        "value": {
            "cluster": "gpu",
            "cluster_id": "1a2b3c",
            "region": "us-east-1",
            "zone": "us-east-1b",
            "ecr": {"repository_url": "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-gpu-1a2b3c",
                    "created_by_us": True, "instance_role": "multinode-gpu-1a2b3c"},
            "subnet_cidr": "10.42.1.0/24",
            "ssh_user": "ubuntu",
            "nodes": [
                {"name": "node-0", "hostname": "gpu-node-0", "private_ip": "10.42.1.23", "public_ip": "54.163.10.7",
                 "instance_id": "i-0a1b2c3d4e5f60718", "instance_type": "g4dn.xlarge", "accelerator": "nvidia",
                 "accelerator_count": 1},
                {"name": "node-1", "hostname": "gpu-node-1", "private_ip": "10.42.1.187", "public_ip": "3.90.44.201",
                 "instance_id": "i-0f9e8d7c6b5a40312", "instance_type": "g4dn.xlarge", "accelerator": "nvidia",
                 "accelerator_count": 1},
            ],
        },
    }
}
KEYS = {"node-0": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0 gpu-node-0",
        "node-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH1 gpu-node-1"}


@pytest.fixture
def state(tmp_path):
    return ClusterState.for_cluster("gpu", root=tmp_path)


def test_outputs_round_trip_into_inventory(state, tmp_path):
    inv = inventory_from_outputs(OUTPUTS, state, KEYS, "multinode-cuda:1")
    assert [n.name for n in inv.nodes] == ["node-0", "node-1"]
    assert inv.head.ssh_host == "54.163.10.7" and inv.head.private_ip == "10.42.1.23"
    assert inv.nodes[1].host_key == KEYS["node-1"] and inv.nodes[1].instance_id == "i-0f9e8d7c6b5a40312"
    assert inv.accelerator == "nvidia" and inv.nodes[0].accelerator_count == 1
    assert (inv.provider, inv.runtime, inv.image, inv.workdir) == ("aws", "docker", "multinode-cuda:1", "/opt/multinode")
    assert inv.interpreter == "python3" and inv.extra["region"] == "us-east-1"
    assert inv.extra["mpi_ssh_key"] == "/opt/multinode/.ssh/id_ed25519"
    assert inv.extra["ecr_repository_url"] == "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-gpu-1a2b3c"
    assert (inv.extra["cluster_id"], inv.extra["zone"], inv.extra["ecr_created"]) == ("1a2b3c", "us-east-1b", True)
    assert inv.extra["mpi_ssh_port"] == 2222  # the image's sshd: remote ranks must start inside the image
    assert inv.ssh_key == str(state.ssh_key) and inv.known_hosts == str(state.known_hosts)
    inv.save(tmp_path / "inv.json")
    assert Inventory.load(tmp_path / "inv.json") == inv


def test_known_hosts_pins_public_and_private_address(state):
    lines = known_hosts_lines(inventory_from_outputs(OUTPUTS, state, KEYS, "img"))
    assert lines == [f"54.163.10.7,10.42.1.23 {KEYS['node-0']}\n", f"3.90.44.201,10.42.1.187 {KEYS['node-1']}\n"]


def test_missing_output_field_names_it(state):
    broken = json.loads(json.dumps(OUTPUTS))
    del broken["inventory"]["value"]["nodes"][0]["private_ip"]
    with pytest.raises(UserError, match="private_ip"):
        inventory_from_outputs(broken, state, KEYS, "img")


def test_private_ip_outside_subnet_is_refused(state):
    broken = json.loads(json.dumps(OUTPUTS))
    broken["inventory"]["value"]["subnet_cidr"] = "10.99.0.0/24"
    with pytest.raises(UserError, match="outside subnet"):
        inventory_from_outputs(broken, state, KEYS, "img")


ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-cuda:latest"


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("REGION", "SSH_CIDR", "TTL_HOURS", "SPOT", "OWNER", "IMAGE", "INSTANCE_TYPE", "BUCKETS"):
        monkeypatch.delenv(f"MULTINODE_{name}", raising=False)
    monkeypatch.delenv("TF_VAR_root_volume_gb", raising=False)
    return monkeypatch


@pytest.mark.parametrize("options, message", [
    ({"ssh_cidr": "203.0.113.4/32"}, "REGION is not set.*make up PROVIDER=aws SSH_CIDR=203.0.113.4/32 REGION=us-east-1"),
    ({"region": "us-east-1"}, "SSH_CIDR is not set.*make up PROVIDER=aws SSH_CIDR="),
    ({"region": "us-east-1", "ssh_cidr": "0.0.0.0/0"}, "whole internet"),
    ({"region": "us-east-1", "ssh_cidr": "not-a-cidr"}, "is not a CIDR"),
    ({"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", "ttl_hours": "100"}, "TTL_HOURS='100' must be"),
    ({"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", "buckets": "data s3://ckpt/x"},
     "BUCKETS: 's3://ckpt/x' is not an S3 bucket name .* give the names alone"),
])
def test_bad_settings_are_one_line_user_errors(clean_env, options, message):
    with pytest.raises(UserError, match=message):
        AwsSettings.from_spec(ClusterSpec(name="gpu", provider="aws", options=options))


def test_settings_fall_back_to_environment(clean_env):
    clean_env.setenv("MULTINODE_REGION", "eu-west-1")
    clean_env.setenv("MULTINODE_SSH_CIDR", "198.51.100.7/32")
    clean_env.setenv("MULTINODE_SPOT", "1")
    clean_env.setenv("MULTINODE_OWNER", "alice")
    clean_env.setenv("MULTINODE_IMAGE", ECR_IMAGE)
    clean_env.setenv("MULTINODE_BUCKETS", "my-data my-checkpoints")
    settings = AwsSettings.from_spec(ClusterSpec(name="gpu", provider="aws", cluster_type="g4ad"))
    assert (settings.region, settings.ssh_cidr, settings.spot, settings.owner, settings.ttl_hours, settings.buckets) == (
        "eu-west-1", "198.51.100.7/32", True, "alice", 8, ("my-data", "my-checkpoints"))


def test_cost_line_adds_public_ipv4_and_gp3_root_volumes(clean_env):
    prices = json.loads(prices_path().read_text())
    assert prices["date"] and prices["source"] and set(prices["sources"]) >= {
        "public_ipv4_usd_per_hour", "gp3_usd_per_gb_month", "on_demand_usd_per_hour.eu-west-1"}
    spec = ClusterSpec(name="gpu", provider="aws", nodes=2, cluster_type="g4dn",
                       options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", "image": ECR_IMAGE})
    line = cost_line(spec, AwsSettings.from_spec(spec), prices)
    # 2 x 0.526 + 2 x 0.005 + 2 x 100 GiB x 0.08 / 730 = 1.052 + 0.010 + 0.0219
    assert line == ("2 x g4dn.xlarge on-demand $1.05/h + 2 public IPv4 $0.01/h + 2 x 100 GiB gp3 $0.02/h = $1.08/h "
                    f"(prices of {prices['date']}, us-east-1)")


def test_cost_line_in_another_region_names_what_has_no_price(clean_env):
    spec = ClusterSpec(name="gpu", provider="aws", nodes=3, cluster_type="g4ad",
                       options={"region": "eu-west-1", "ssh_cidr": "203.0.113.4/32"})
    clean_env.setenv("TF_VAR_root_volume_gb", "200")
    line = cost_line(spec, AwsSettings.from_spec(spec), json.loads(prices_path().read_text()))
    # 3 x 0.42263 + 3 x 0.005 = 1.28289; no verified gp3 price for eu-west-1: named, not added.
    assert line.startswith("3 x g4ad.xlarge on-demand $1.27/h + 3 public IPv4 $0.01/h + "
                           "3 x 200 GiB gp3 (no price for eu-west-1 in infra/prices.json) = $1.28/h")


def test_a_bad_root_volume_override_is_one_line(clean_env):
    clean_env.setenv("TF_VAR_root_volume_gb", "big")
    spec = ClusterSpec(name="gpu", provider="aws", options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32"})
    with pytest.raises(UserError, match="TF_VAR_root_volume_gb='big' must be a whole number"):
        cost_line(spec, AwsSettings.from_spec(spec), json.loads(prices_path().read_text()))


def test_generated_host_key_is_openssh_ed25519():
    private, public = new_ed25519("c-node-0")
    assert "BEGIN OPENSSH PRIVATE KEY" in private and public.startswith("ssh-ed25519 ") and public.endswith(" c-node-0")


@pytest.mark.parametrize("image", ["multinode-cuda:latest", "library/ubuntu:24.04", "multinode-cuda"])
def test_a_local_only_image_is_refused_with_how_to_push(clean_env, image):
    spec = ClusterSpec(name="gpu", provider="aws", cluster_type="g4dn",
                       options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", "image": image})
    with pytest.raises(UserError) as err:
        AwsSettings.from_spec(spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"IMAGE_REF={image} is a local tag the nodes cannot pull")
    assert "'make image IMAGE=cuda PUSH=1 ECR=<account>.dkr.ecr.us-east-1.amazonaws.com'" in message


def test_no_image_given_means_the_host_runtime(clean_env, state):
    """No registry dance: without IMAGE_REF, up is not refused and jobs run in the bootstrap's virtualenv."""
    spec = ClusterSpec(name="gpu", provider="aws", options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32"})
    assert AwsSettings.from_spec(spec).image is None
    inv = inventory_from_outputs(OUTPUTS, state, KEYS, None)
    assert (inv.runtime, inv.image, inv.interpreter) == ("host", None, "/opt/multinode/venv/bin/python")
    # mpirun on the head reaches the other nodes' own sshd, with the key the head gets in its work directory.
    assert (inv.extra["mpi_ssh_port"], inv.extra["mpi_ssh_key"]) == (22, "/opt/multinode/.ssh/id_ed25519")
    assert "container_python" not in inv.extra


def test_a_local_tag_error_also_names_the_host_runtime(clean_env):
    spec = ClusterSpec(name="gpu", provider="aws", options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32",
                                                           "image": "multinode-cpu:latest"})
    with pytest.raises(UserError, match="leave IMAGE_REF unset to run jobs in the host runtime$"):
        AwsSettings.from_spec(spec)


@pytest.mark.parametrize("image, registry, repository", [
    (ECR_IMAGE, "123456789012.dkr.ecr.us-east-1.amazonaws.com", "multinode-cuda"),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/team/multinode@sha256:" + "a" * 64,
     "123456789012.dkr.ecr.us-east-1.amazonaws.com", "team/multinode"),
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/multinode-cuda:1", "123456789012.dkr.ecr.eu-west-1.amazonaws.com", None),
    ("ghcr.io/example/multinode-cuda:1", "ghcr.io", None),
    ("localhost:5000/multinode-cpu", "localhost:5000", None),
    ("multinode-cpu:latest", None, None),
])
def test_registry_and_ecr_repository_of_an_image(image, registry, repository):
    assert registry_of(image) == registry
    assert ecr_repository_of(image, "us-east-1") == repository


def test_the_cost_lines_root_volume_default_is_the_modules():
    variables = (Path(__file__).resolve().parents[2] / "infra" / "ec2" / "variables.tf").read_text()
    block = variables.split('variable "root_volume_gb"')[1].split("\n}\n")[0]
    assert int(re.search(r"default\s*=\s*(\d+)", block).group(1)) == ROOT_VOLUME_GB


def test_recovery_takes_an_instance_ec2_no_longer_runs_as_gone():
    """Provider.gone on EC2: DescribeInstances' state, an id no longer listed counted as terminated."""
    from multinode.providers.aws.ec2 import not_running

    class Ec2:
        def describe_instances(self, Filters):
            ids = Filters[0]["Values"]
            states = {"i-1": "running", "i-2": "shutting-down", "i-3": "pending"}
            return {"Reservations": [{"Instances": [{"InstanceId": i, "State": {"Name": states[i]}}
                                                    for i in ids if i in states]}]}

    assert not_running(Ec2(), ["i-1", "i-2", "i-3", "i-4"]) == {"i-2": "shutting-down", "i-4": "terminated"}
    assert not_running(Ec2(), []) == {}
