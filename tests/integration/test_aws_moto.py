"""The AWS provider against a real ``moto_server`` on loopback (never AWS).

Covered with the real Terraform binary and AWS provider (offline, from the local mirror; see
terraform_offline.py): ``make up``'s whole flow through ``AwsProvider`` (terraform init/apply of
infra/ec2, the hardening of what it made as read back with boto3, inventory from the real
``terraform output``, status wait, SSH wait, pinned known_hosts), then ``down`` (terraform destroy +
the leak check), and a plan of the production defaults (placement group on) of a g4dn example.
One variable, ``AWS_ENDPOINT_URL``, points both boto3 and Terraform's AWS provider at moto.

With boto3 alone: status-check wait, tag discovery, leak verification (stopped counts), reap
dry-run vs --yes, ``down`` refusing to forget a leaked instance; and the failure path of ``up``
(destroy on failure) with Terraform replaced by a stand-in that creates instances through moto.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
import yaml

from multinode.core.config import ClusterSpec
from multinode.core.errors import NodeError, UserError
from multinode.core.inventory import Inventory
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import sweep as aws_sweep
from multinode.providers.aws.keys import new_ed25519
from multinode.providers.aws.provider import AwsProvider
from multinode.providers.aws.reap import reap, verify_gone
from multinode.providers.aws.terraform import inventory_from_outputs
from multinode.core.state import ClusterState
import motoserver
from motoserver import moto_server
from terraform_offline import MODULE, require_terraform, terraform_env

pytestmark = pytest.mark.integration

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in images: no image look-up
# An image in a registry that is not this region's ECR: Terraform makes a repository for the cluster.
IMAGE = "ghcr.io/example/multinode-cpu:1"


@pytest.fixture(scope="session")
def moto_url():
    # AWS-managed IAM policies (AmazonEC2ContainerRegistryReadOnly) exist in moto only when loaded.
    with moto_server(MOTO_IAM_LOAD_MANAGED_POLICIES="true") as url:
        yield url


@pytest.fixture
def ec2(moto_url, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # any client made by the code under test goes to moto too
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"), timeout=60).close()
    mark = moto_url.mark()
    yield boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)
    moto_url.show_since(mark)  # on stderr at teardown: pytest shows it when the test failed (motoserver.py)


def moto_clients(region: str) -> aws_sweep.Clients:
    """EC2, IAM and ECR clients for moto (AWS_ENDPOINT_URL); moto 5.2.5 has no placement group API."""
    return aws_sweep.Clients.for_region(region, placement_groups=False)


def _subnet(ec2) -> str:
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    return ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24")["Subnet"]["SubnetId"]


def _launch(ec2, count: int, cluster: str | None, subnet: str | None = None, cluster_id: str | None = None,
            expiry: str = "2026-11-22T18:00:00Z") -> list[str]:
    tags = [{"Key": "owner", "Value": "alice"}, {"Key": "expiry", "Value": expiry}]
    if cluster:
        tags += [{"Key": "cluster", "Value": cluster}, {"Key": "managed-by", "Value": "multinode"}]
    if cluster_id:
        tags.append({"Key": "cluster-id", "Value": cluster_id})
    extra = {"SubnetId": subnet} if subnet else {}
    reply = ec2.run_instances(ImageId=AMI, InstanceType="c6i.xlarge", MinCount=count, MaxCount=count,
                              TagSpecifications=[{"ResourceType": "instance", "Tags": tags}], **extra)
    return [i["InstanceId"] for i in reply["Instances"]]


def test_the_log_names_every_request_of_a_burst_moto_served_at_once(ec2, moto_url):
    """moto's recorder writes an entry and its newline in two calls, so requests served at once can share a line (a
    cold run's teardown failed reading one such line as one JSON value): every request of a burst is still named."""
    mark = moto_url.mark()
    clients = [boto3.client("ec2", region_name=REGION, endpoint_url=moto_url) for _ in range(8)]
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(lambda client: [client.describe_vpcs() for _ in range(5)], clients))
    assert moto_url.since(mark).count(" DescribeVpcs") == 40
    shared = '{"method": "POST", "url": "/", "body": "Action=A"}{"method": "POST", "url": "/", "body": "Action=B"}\n\n'
    assert [e["body"] for e in motoserver._entries(shared + '{"method": "PO')] == ["Action=A", "Action=B"]


def test_status_wait_passes_when_running_and_checks_ok(ec2):
    ids = _launch(ec2, 2, "alpha")
    aws_ec2.wait_status_ok(ec2, ids, timeout=30, poll=0.2)


def test_status_wait_fails_at_once_on_a_stopped_instance(ec2):
    ids = _launch(ec2, 2, "alpha")
    ec2.stop_instances(InstanceIds=[ids[1]])
    with pytest.raises(NodeError, match=f"instance {ids[1]} is stopp"):
        aws_ec2.wait_status_ok(ec2, ids, timeout=30, poll=0.2)


def test_tag_discovery_finds_only_the_cluster_and_only_ours(ec2):
    alpha = _launch(ec2, 2, "alpha")
    beta = _launch(ec2, 1, "beta")
    _launch(ec2, 1, None)  # someone else's instance: never ours to report or terminate
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2, "alpha")] == sorted(alpha)
    every = aws_ec2.tagged_instances(ec2)
    assert sorted(i.instance_id for i in every) == sorted(alpha + beta)
    assert {i.owner for i in every} == {"alice"} and {i.cluster for i in every} == {"alpha", "beta"}


def test_leak_verification_counts_stopped_and_clears_after_terminate(ec2):
    ids = _launch(ec2, 2, "alpha")
    ec2.stop_instances(InstanceIds=[ids[0]])
    with pytest.raises(UserError) as err:
        verify_gone(ec2, "alpha", REGION)
    assert all(i in str(err.value) for i in ids) and "make reap REGION=us-east-1" in str(err.value)
    assert "stopp" in str(err.value)
    aws_ec2.terminate(ec2, ids, timeout=60)
    assert "verified: no instance tagged cluster=alpha" in verify_gone(ec2, "alpha", REGION)[0]


def test_reap_lists_without_yes_and_terminates_with_yes(ec2):
    ids = _launch(ec2, 2, "alpha")  # past their expiry: their TTL timer did not end them
    fresh = _launch(ec2, 1, "beta", expiry="2999-01-01T00:00:00Z")  # within its TTL: never reaped
    dry = reap(REGION, None, yes=False, ec2=ec2, clients=moto_clients(REGION))
    assert [line.split()[0] for line in dry[:-1]] == sorted(ids) and "YES=1" in dry[-1]
    assert len(aws_ec2.tagged_instances(ec2, "alpha")) == 2  # nothing touched
    done = reap(REGION, "alpha", yes=True, ec2=ec2, clients=moto_clients(REGION))
    assert done[-1] == f"terminated 2 instances in {REGION}"
    assert aws_ec2.tagged_instances(ec2, "alpha") == []
    assert reap(REGION, "alpha", yes=False, ec2=ec2, clients=moto_clients(REGION)) == [
        f"no expired instance or other leftover tagged cluster=alpha, managed-by=multinode in {REGION}"]
    reap(REGION, None, yes=True, ec2=ec2, clients=moto_clients(REGION))
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2)] == fresh


class FakeTerraform:
    """Stands in for the terraform binary where a failure must be staged (an instance that stops
    right after apply): apply creates the instances through moto, output prints what
    infra/ec2/outputs.tf would. The success path runs the real binary (below)."""

    def __init__(self, ec2, ssh_host: str, break_after_apply: bool = False) -> None:
        self.ec2, self.ssh_host, self.break_after_apply = ec2, ssh_host, break_after_apply
        self.calls: list[str] = []
        self.ids: list[str] = []

    def __call__(self, tf_dir: Path, command: str, *args: str) -> str:
        self.calls.append(command)
        tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())
        if command == "apply":
            assert (tf_dir / "compute.tf").exists()  # the module was copied next to its state
            self.ids = _launch(self.ec2, tfvars["nodes"], tfvars["cluster_name"], _subnet(self.ec2))
            (tf_dir / "terraform.tfstate").write_text("{}")
            if self.break_after_apply:
                self.ec2.stop_instances(InstanceIds=[self.ids[-1]])
        elif command == "output":
            found = self.ec2.describe_instances(InstanceIds=self.ids)["Reservations"][0]["Instances"]
            by_id = {i["InstanceId"]: i for i in found}
            nodes = [{"name": f"node-{n}", "hostname": f"{tfvars['cluster_name']}-node-{n}",
                      "private_ip": by_id[iid]["PrivateIpAddress"], "public_ip": self.ssh_host,
                      "instance_id": iid, "instance_type": "c6i.xlarge", "accelerator": "none",
                      "accelerator_count": 0} for n, iid in enumerate(self.ids)]
            return json.dumps({"inventory": {"sensitive": False, "value": {
                "cluster": tfvars["cluster_name"], "cluster_id": tfvars["cluster_id"], "zone": "us-east-1a",
                "ecr": {"repository_url": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/multinode-x",
                        "created_by_us": True, "instance_role": "multinode-x"},
                "region": tfvars["region"], "subnet_cidr": "10.42.1.0/24",
                "ssh_user": "ubuntu", "nodes": nodes}}})
        elif command == "state":
            return ""  # nothing of the stand-in's lives in Terraform state
        elif command == "destroy":
            aws_ec2.terminate(self.ec2, self.ids, timeout=60)
        return ""


@pytest.fixture
def ssh_listener():
    """A listening socket on loopback standing in for the nodes' sshd (the TCP wait only connects)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def _spec(name: str, nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(name=name, provider="aws", nodes=nodes,
                       options={"region": REGION, "ssh_cidr": "203.0.113.4/32", "owner": "alice", "image": IMAGE})


def test_failed_up_destroys_what_it_made_and_reraises(ec2, tmp_path, ssh_listener):
    state = ClusterState.for_cluster("beta", root=tmp_path)
    terraform = FakeTerraform(ec2, "127.0.0.1", break_after_apply=True)
    provider = AwsProvider(terraform=terraform, ec2_client=lambda region: ec2, ssh_port=ssh_listener,
                           clients=moto_clients)
    with pytest.raises(NodeError, match="stopp"):
        provider.up(_spec("beta"), state)
    assert terraform.calls[-1] == "destroy"
    assert aws_ec2.tagged_instances(ec2, "beta") == [] and not state.inventory_path.exists()


def test_down_terminates_what_terraform_forgot_and_spares_a_twin(ec2, tmp_path):
    """down sweeps by tags: an instance of this cluster that Terraform's state lacks ends too; one of
    another cluster of the same name (another cluster-id) is left alone and does not fail the check."""
    state = ClusterState.for_cluster("gamma", root=tmp_path)
    (state.provider_dir / "terraform").mkdir(parents=True)
    (state.provider_dir / "aws.json").write_text(json.dumps({"region": REGION, "cluster": "gamma", "cluster_id": "aaaaaa"}))
    (state.provider_dir / "terraform" / "terraform.tfstate").write_text("{}")
    calls = []
    provider = AwsProvider(terraform=lambda tf_dir, *args: calls.append(args[0]) or "", ec2_client=lambda region: ec2,
                           clients=moto_clients)
    leaked = _launch(ec2, 1, "gamma", cluster_id="aaaaaa")  # e.g. created outside Terraform's state
    twin = _launch(ec2, 1, "gamma", cluster_id="bbbbbb")
    lines = provider.down(state)
    assert calls == ["state", "destroy"] and f"terminated instance {leaked[0]}" in lines
    assert lines[-1].startswith("verified: no instance tagged cluster=gamma, cluster-id=aaaaaa")
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2, "gamma")] == twin
    assert not state.provider_dir.exists()


# --- the real terraform binary against moto ---------------------------------------------------


@pytest.fixture
def offline_terraform(ec2, tmp_path, monkeypatch) -> str:
    """The real binary and AWS provider; ``ec2`` has set AWS_ENDPOINT_URL, which Terraform's AWS
    provider honours like boto3, so both talk to moto (STS included) and nothing else."""
    binary = require_terraform()
    for key, value in terraform_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance metadata service
    # Two gaps of moto 5.2.5, bridged with variables every user has too (TF_VAR_<name>): names under
    # /aws/service/ are reserved, so the SSM AMI parameter cannot be seeded; CreatePlacementGroup is
    # not implemented, so the placement group is only planned (test below), never created here.
    monkeypatch.setenv("TF_VAR_ami_id", AMI)
    monkeypatch.setenv("TF_VAR_placement_group", "false")
    return binary


def _instances(ec2, cluster: str) -> list[dict]:
    found = ec2.describe_instances(Filters=[{"Name": "tag:cluster", "Values": [cluster]}])["Reservations"]
    return sorted((i for r in found for i in r["Instances"]), key=lambda i: i["InstanceId"])


def test_up_and_down_run_the_real_terraform_against_moto(ec2, offline_terraform, tmp_path, ssh_listener, capfd):
    state = ClusterState.for_cluster("tfreal", root=tmp_path)
    probed: list[str] = []

    def wait_ssh(hosts, port, timeout):
        probed.extend(hosts)  # the public addresses moto made up: recorded, never connected to
        aws_ec2.wait_tcp(["127.0.0.1"] * len(hosts), port, timeout=timeout, poll=0.2)

    waited: list[tuple[str, ...]] = []

    def wait_ready(inventory, image):  # the bootstrap wait itself runs against real SSH nodes: test_readiness.py
        waited.append((image, *(n.public_ip for n in inventory.nodes)))

    # real run_terraform and boto3 client
    provider = AwsProvider(ssh_port=ssh_listener, wait_ssh=wait_ssh, wait_ready=wait_ready, clients=moto_clients)
    inv = provider.up(_spec("tfreal"), state)
    # terraform apply's progress, a plain line per resource step (stderr is not a terminal here)
    shown = capfd.readouterr().err
    assert re.search(r"^terraform apply: aws_instance\.node\[1\]: Creation complete after ", shown, re.M), shown[-2000:]
    tf_dir = state.provider_dir / "terraform"
    tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())

    # The inventory came from the real `terraform output -json` and says what EC2 says.
    # The inventory's subnet is the VPC's block: it holds the subnet of every zone a node may be moved to.
    assert Inventory.load(state.inventory_path) == inv and inv.cluster == "tfreal" and inv.subnet == "10.42.0.0/16"
    outputs = json.loads(subprocess.run([offline_terraform, f"-chdir={tf_dir}", "output", "-json"],
                                        capture_output=True, text=True, check=True).stdout)
    keys = {f"node-{i}": k["public_key"] for i, k in enumerate(tfvars["host_keys"])}
    assert inventory_from_outputs(outputs, state, keys, inv.image) == inv
    by_id = {i["InstanceId"]: i for i in _instances(ec2, "tfreal")}
    assert [n.name for n in inv.nodes] == ["node-0", "node-1"] and set(by_id) == {n.instance_id for n in inv.nodes}
    for node in inv.nodes:
        found = by_id[node.instance_id]
        assert (node.private_ip, node.public_ip) == (found["PrivateIpAddress"], found["PublicIpAddress"])
        assert node.hostname == f"tfreal-{node.name}" and node.accelerator == "none"
    assert probed == [n.public_ip for n in inv.nodes]
    assert waited == [(inv.image, *probed)]

    # What Terraform made, read back with boto3: tags, IMDSv2, encrypted root, TTL terminate, pinned host keys.
    unique = f"multinode-tfreal-{tfvars['cluster_id']}"
    sg = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [unique]}])
    sg = sg["SecurityGroups"][0]
    for node, key in zip(inv.nodes, tfvars["host_keys"]):
        found = by_id[node.instance_id]
        tags = {t["Key"]: t["Value"] for t in found["Tags"]}
        assert tags == {"cluster": "tfreal", "cluster-id": tfvars["cluster_id"], "owner": "alice", "expiry": tfvars["expires_at"],
                        "managed-by": "multinode", "Name": f"tfreal-{node.name}", "node": node.name}
        assert found["InstanceType"] == "c6i.xlarge" and found["ImageId"] == AMI
        assert found["MetadataOptions"]["HttpTokens"] == "required"
        assert [g["GroupId"] for g in found["NetworkInterfaces"][0]["Groups"]] == [sg["GroupId"]]
        shutdown = ec2.describe_instance_attribute(InstanceId=node.instance_id,
                                                   Attribute="instanceInitiatedShutdownBehavior")
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        (volume,) = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                                   "Values": [node.instance_id]}])["Volumes"]
        assert volume["Encrypted"] and volume["VolumeType"] == "gp3" and volume["Size"] == 100
        (root,) = found["BlockDeviceMappings"]
        assert root["Ebs"]["VolumeId"] == volume["VolumeId"] and root["Ebs"]["DeleteOnTermination"]
        assert {t["Key"]: t["Value"] for t in volume["Tags"]}["expiry"] == tfvars["expires_at"]
        user_data = ec2.describe_instance_attribute(InstanceId=node.instance_id, Attribute="userData")
        cloud_config = yaml.safe_load(base64.b64decode(user_data["UserData"]["Value"]))
        assert cloud_config["ssh_keys"]["ed25519_public"] == key["public_key"] == node.host_key
        assert cloud_config["ssh_keys"]["ed25519_private"] == key["private_key"] and cloud_config["ssh_genkeytypes"] == []
        assert f"{node.public_ip},{node.private_ip} {key['public_key']}\n" in state.known_hosts.read_text()

    # SSH only from ssh_cidr, everything from the cluster itself, nothing else; the VPC's default SG is closed.
    ingress = sorted((p["IpProtocol"], p.get("FromPort"), p.get("ToPort"), tuple(r["CidrIp"] for r in p["IpRanges"]),
                      tuple(g["GroupId"] for g in p["UserIdGroupPairs"])) for p in sg["IpPermissions"])
    assert ingress == [("-1", None, None, (), (sg["GroupId"],)), ("tcp", 22, 22, ("203.0.113.4/32",), ())]
    default = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [sg["VpcId"]]},
                                                    {"Name": "group-name", "Values": ["default"]}])
    assert default["SecurityGroups"][0]["IpPermissions"] == [] == default["SecurityGroups"][0]["IpPermissionsEgress"]

    # The tags Terraform set are the ones the leak check and reap look for.
    with pytest.raises(UserError, match="still has instances in a billing state"):
        verify_gone(ec2, "tfreal", REGION)
    assert [i.instance_id for i in aws_ec2.tagged_instances(ec2, "tfreal")] == sorted(by_id)
    # Within their TTL: reap leaves them alone.
    assert reap(REGION, "tfreal", yes=False, ec2=ec2, clients=moto_clients(REGION)) == [
        f"no expired instance or other leftover tagged cluster=tfreal, managed-by=multinode in {REGION} "
        "(2 instances within their TTL left alone)"]

    # down: the real terraform destroy, then the provider's own leak check; nothing of the cluster is left.
    lines = provider.down(state)
    assert lines[0] == "terraform destroy of cluster 'tfreal' done" and lines[-1].startswith(
        "verified: no instance tagged cluster=tfreal")
    assert {i["State"]["Name"] for i in _instances(ec2, "tfreal")} == {"terminated"}
    assert ec2.describe_vpcs(Filters=[{"Name": "tag:cluster", "Values": ["tfreal"]}])["Vpcs"] == []
    assert ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [unique]}])[
        "SecurityGroups"] == []
    assert ec2.describe_key_pairs()["KeyPairs"] == []
    assert not state.provider_dir.exists() and not state.inventory_path.exists()


def test_plan_of_the_g4dn_example_with_the_production_defaults(ec2, offline_terraform, tmp_path, monkeypatch):
    """examples/g4dn.tfvars as a user would plan it (placement group on), against moto's API."""
    monkeypatch.delenv("TF_VAR_placement_group")
    work = tmp_path / "ec2"
    shutil.copytree(MODULE, work)
    host_keys = [new_ed25519(f"g4dn-demo-node-{i}") for i in range(2)]
    (work / "keys.auto.tfvars.json").write_text(json.dumps({
        "ssh_cidr": "203.0.113.4/32", "bucket_names": ["demo-data", "demo-ckpt"],  # make up BUCKETS="demo-data ..."
        "host_keys": [{"private_key": private, "public_key": public} for private, public in host_keys]}))
    env = dict(os.environ)

    def terraform(*args: str) -> str:
        result = subprocess.run([offline_terraform, f"-chdir={work}", *args, "-no-color"], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    terraform("init", "-input=false", "-lockfile=readonly")
    terraform("plan", "-input=false", "-var-file=examples/g4dn.tfvars", "-out=plan.bin")
    plan = json.loads(terraform("show", "-json", "plan.bin"))
    planned = {r["address"]: r["values"] for r in plan["planned_values"]["root_module"]["resources"]}
    changes = {r["address"]: r["change"] for r in plan["resource_changes"]}
    assert {tuple(c["actions"]) for c in changes.values()} == {("create",)}
    assert planned["aws_placement_group.cluster[0]"]["strategy"] == "cluster"
    for i, (_, public) in enumerate(host_keys):
        node = planned[f"aws_instance.node[{i}]"]
        assert changes[f"aws_instance.node[{i}]"]["after_unknown"]["placement_group"] is True  # the group's id
        assert node["instance_type"] == "g4dn.xlarge" and node["instance_initiated_shutdown_behavior"] == "terminate"
        assert node["metadata_options"][0]["http_tokens"] == "required" and node["root_block_device"][0]["encrypted"]
        assert node["tags_all"]["cluster"] == "g4dn-demo" and node["tags_all"]["managed-by"] == "multinode"
        assert node["associate_public_ip_address"] and node["ami"] == AMI
    # With ami_id given, the SSM parameter is not read (no ssm:GetParameter needed): only the zones are.
    read = {r["address"]: r["values"] for r in plan["prior_state"]["values"]["root_module"]["resources"]
            if r["mode"] == "data"}
    assert set(read) == {"data.aws_ec2_instance_type_offerings.zones[0]", "data.aws_iam_policy_document.assume_ec2",
                         "data.aws_iam_policy_document.buckets[0]", "data.aws_partition.current"}
    # BUCKETS: the node role may list those two buckets and read, write and delete their objects, nothing else.
    policy = json.loads(planned["aws_iam_role_policy.buckets[0]"]["policy"])
    grants = {tuple(sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])):
              sorted([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]) for s in policy["Statement"]}
    assert grants == {("s3:GetBucketLocation", "s3:ListBucket"): ["arn:aws:s3:::demo-ckpt", "arn:aws:s3:::demo-data"],
                      ("s3:DeleteObject", "s3:GetObject", "s3:PutObject"): ["arn:aws:s3:::demo-ckpt/*",
                                                                            "arn:aws:s3:::demo-data/*"],
                      ("kms:Decrypt", "kms:GenerateDataKey"): ["*"]}, policy
    # SSE-KMS buckets: any key, but only through S3 in this region and only for these buckets' objects (issue 47
    # item 6; before, the role had no KMS action and a KMS-encrypted bucket was refused).
    (kms,) = [s for s in policy["Statement"] if s["Sid"] == "UseTheirKmsKeysThroughS3"]
    assert kms["Condition"]["StringEquals"] == {"kms:ViaService": "s3.us-east-1.amazonaws.com"}
    assert sorted(kms["Condition"]["StringLike"]["kms:EncryptionContext:aws:s3:arn"]) == [
        "arn:aws:s3:::demo-ckpt", "arn:aws:s3:::demo-ckpt/*", "arn:aws:s3:::demo-data", "arn:aws:s3:::demo-data/*"]
    # The subnet goes to the first zone (by name) that offers g4dn.xlarge, as moto's offerings say.
    offerings = ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g4dn.xlarge"]}])
    offered = sorted(o["Location"] for o in offerings["InstanceTypeOfferings"])
    assert sorted(read["data.aws_ec2_instance_type_offerings.zones[0]"]["locations"]) == offered
    assert planned["aws_subnet.this[0]"]["availability_zone"] == offered[0]
    # ...and every other zone that offers it gets a subnet too, for a node EC2 has no capacity for there (item 4).
    spare = {r["values"]["availability_zone"]: r["values"]["cidr_block"] for a, r in
             ((r["address"], r) for r in plan["planned_values"]["root_module"]["resources"]) if a.startswith("aws_subnet.spare")}
    assert sorted(spare) == offered[1:] and len(set(spare.values())) == len(spare)
    assert planned["aws_subnet.this[0]"]["cidr_block"] not in spare.values()
    assert planned["aws_key_pair.client"]["key_name"] == planned["aws_placement_group.cluster[0]"]["name"] == (
        "multinode-g4dn-demo-0a1b2c")
    assert planned["aws_ecr_repository.cluster[0]"]["name"] == "multinode-g4dn-demo-0a1b2c"
    assert planned["aws_iam_role_policy_attachment.ecr_read"]["policy_arn"] == (
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly")


def test_a_type_no_zone_offers_is_refused_at_plan(ec2, offline_terraform, tmp_path):
    """moto's offerings list no zone of us-east-1 for g4ad.xlarge: the plan stops with the precondition's
    message instead of creating a subnet where the instances could never start."""
    assert ec2.describe_instance_type_offerings(LocationType="availability-zone", Filters=[
        {"Name": "instance-type", "Values": ["g4ad.xlarge"]}])["InstanceTypeOfferings"] == []
    work = tmp_path / "ec2"
    shutil.copytree(MODULE, work)
    keys = [new_ed25519(f"g4ad-demo-node-{i}") for i in range(2)]
    (work / "keys.auto.tfvars.json").write_text(json.dumps({
        "ssh_cidr": "203.0.113.4/32", "host_keys": [{"private_key": k, "public_key": p} for k, p in keys]}))
    run = [offline_terraform, f"-chdir={work}"]
    init = subprocess.run([*run, "init", "-input=false", "-no-color", "-lockfile=readonly"], capture_output=True, text=True)
    assert init.returncode == 0, init.stdout + init.stderr
    plan = subprocess.run([*run, "plan", "-input=false", "-no-color", "-var-file=examples/g4ad.tfvars"],
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 1 and plan.stderr.count("Error:") == 1, plan.stderr
    assert "No availability zone of us-east-1 offers g4ad.xlarge; pick another REGION or INSTANCE_TYPE" in " ".join(
        plan.stderr.split())
