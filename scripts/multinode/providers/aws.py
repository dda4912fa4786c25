"""The ``aws`` provider: an EC2 cluster from ``infra/ec2`` (Terraform), checked with boto3.

``up``: settings from ``spec.options`` (or MULTINODE_REGION, MULTINODE_SSH_CIDR, MULTINODE_TTL_HOURS,
MULTINODE_SPOT, MULTINODE_OWNER, MULTINODE_IMAGE); a client key and one ed25519 host key per node are
made here, so the host keys are pinned before the first connection (no trust-on-first-use; the
trade-off: the private host key travels in user data, readable via IMDS by anyone on the node).
Then ``terraform init/apply`` on a copy of the module in ``.multinode/<cluster>/provider/``
(state stays there), boto3 waits for both status checks and for port 22, and the inventory is
built from ``terraform output -json``. A failure half-way destroys what was made, then re-raises.

``down``: ``terraform destroy``, then boto3 verifies that no instance tagged with the cluster is
left in a billing state (stopped counts: its EBS bills). ``reap``: list or terminate leaked ones.

``AWS_ENDPOINT_URL`` sends both boto3 and Terraform's AWS provider to another endpoint (the tests:
a moto_server on loopback). Variables of infra/ec2 that multinode does not write (``ami_id``,
``placement_group``, ``vpc_id``/``subnet_id``, ``root_volume_gb``, ``tags``...) can be given as
``TF_VAR_<name>``; the ones it writes to terraform.tfvars.json take precedence over them.
"""

from __future__ import annotations

import getpass
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from multinode.config import ClusterSpec, env_default
from multinode.errors import UserError
from multinode.inventory import Inventory, Node
from multinode.providers import aws_ec2
from multinode.state import ClusterState

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[3]
MODULE_DIR = REPO / "infra" / "ec2"
PRICES = REPO / "infra" / "prices.json"
WORKDIR = "/opt/multinode"
MPI_SSH_PORT = 2222  # the images' sshd (docker/sshd_config)
FIX = "make up PROVIDER=aws SSH_CIDR=203.0.113.4/32 REGION=us-east-1"
DEFAULT_IMAGES = {"cpu": "multinode-cpu:latest", "g4dn": "multinode-cuda:latest", "g4ad": "multinode-rocm:latest"}
STATUS_TIMEOUT = 900.0  # seconds for every node to pass its status checks
SSH_TIMEOUT = 300.0


@dataclass(frozen=True)
class AwsSettings:
    """The AWS-specific part of ``up``, validated once."""

    region: str
    ssh_cidr: str
    ttl_hours: int
    spot: bool
    owner: str
    image: str
    instance_type: str | None

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> "AwsSettings":
        opts = spec.options

        def pick(key: str, default: str | None = None) -> str | None:
            return opts.get(key) or env_default(key.upper(), default)

        region, ssh_cidr = pick("region"), pick("ssh_cidr")
        if not region:
            raise UserError(f"REGION is not set; the AWS provider needs a region: {FIX}")
        if not ssh_cidr:
            raise UserError(f"SSH_CIDR is not set; give your public address as a /32: {FIX}")
        try:
            net = ipaddress.ip_network(ssh_cidr, strict=False)
        except ValueError:
            raise UserError(f"SSH_CIDR={ssh_cidr!r} is not a CIDR; use your address as a /32, e.g. {FIX}") from None
        if net.prefixlen == 0:
            raise UserError(f"SSH_CIDR={ssh_cidr} opens SSH to the whole internet; use your address as a /32: {FIX}")
        ttl = pick("ttl_hours", "8")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 72:
            raise UserError(f"TTL_HOURS={ttl!r} must be a whole number from 1 to 72")
        spot = pick("spot", "0").lower()
        if spot not in ("0", "1", "true", "false", "yes", "no"):
            raise UserError(f"SPOT={spot!r} must be 1 or 0")
        return cls(region=region, ssh_cidr=str(net), ttl_hours=int(ttl), spot=spot in ("1", "true", "yes"),
                   owner=pick("owner") or getpass.getuser(),
                   image=pick("image") or DEFAULT_IMAGES[spec.cluster_type],
                   instance_type=pick("instance_type"))


# --- prices ------------------------------------------------------------------------------


def instance_type_for(spec: ClusterSpec, settings: AwsSettings) -> str:
    return settings.instance_type or {"cpu": "c6i.xlarge", "g4dn": "g4dn.xlarge", "g4ad": "g4ad.xlarge"}[spec.cluster_type]


def cost_line(spec: ClusterSpec, settings: AwsSettings, prices: dict[str, Any]) -> str:
    """``2 x g4dn.xlarge on-demand = $1.05/h (prices of <date>, us-east-1)`` from infra/prices.json."""
    itype = instance_type_for(spec, settings)
    market = "spot" if settings.spot else "on-demand"
    table = prices["on_demand_usd_per_hour"].get(settings.region, {})
    if itype not in table:
        return (f"{spec.nodes} x {itype} {market} = price unknown (no entry for {settings.region} in "
                f"infra/prices.json); check https://aws.amazon.com/ec2/pricing/on-demand/")
    total = spec.nodes * table[itype]
    note = ", spot is usually lower: this is its ceiling" if settings.spot else ""
    return f"{spec.nodes} x {itype} {market} = ${total:.2f}/h (prices of {prices['date']}, {settings.region}{note})"


# --- inventory ---------------------------------------------------------------------------


def inventory_from_outputs(outputs: dict, state: ClusterState, host_keys: dict[str, str], image: str) -> Inventory:
    """Build the inventory from ``terraform output -json`` (the ``inventory`` output of infra/ec2)."""
    try:
        value = outputs["inventory"]["value"]
        ssh_user = value["ssh_user"]
        nodes = tuple(
            Node(name=n["name"], hostname=n["hostname"], private_ip=n["private_ip"], ssh_user=ssh_user,
                 ssh_port=22, host_key=host_keys[n["name"]], public_ip=n.get("public_ip") or None,
                 accelerator=n["accelerator"], accelerator_count=int(n["accelerator_count"]),
                 instance_id=n["instance_id"])
            for n in value["nodes"]
        )
        return Inventory(
            cluster=value["cluster"], provider="aws", nodes=nodes, subnet=value["subnet_cidr"],
            ssh_key=str(state.ssh_key), known_hosts=str(state.known_hosts), workdir=WORKDIR,
            python="python3", runtime="docker", image=image,
            # MODE=mpi: mpirun in the head's container reaches the image's sshd on the other nodes (port
            # 2222, runtimes.mpi_sshd_shell; the host's own sshd keeps 22), so the remote ranks run in the
            # image too; the key and known_hosts live under the work directory, which the container mounts.
            extra={"container_python": "python3", "mpi_ssh_port": MPI_SSH_PORT,
                   "mpi_ssh_key": f"{WORKDIR}/.ssh/id_ed25519",
                   "mpi_known_hosts": f"{WORKDIR}/.ssh/known_hosts", "region": value["region"],
                   "instance_types": sorted({n["instance_type"] for n in value["nodes"]})},
        )
    except KeyError as err:
        raise UserError(f"terraform output 'inventory' lacks {err}; is infra/ec2/outputs.tf out of date?") from None


def known_hosts_lines(inventory: Inventory) -> list[str]:
    """One pinned line per node, valid for its public and private address."""
    lines = []
    for node in inventory.nodes:
        names = [a for a in (node.public_ip, node.private_ip) if a]
        lines.append(f"{','.join(names)} {node.host_key}\n")
    return lines


# --- keys --------------------------------------------------------------------------------


def new_ed25519(comment: str) -> tuple[str, str]:
    """(private key in OpenSSH format, public key line) made locally with ``cryptography``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# --- terraform ---------------------------------------------------------------------------


def terraform_binary() -> str:
    binary = shutil.which("terraform")
    if binary is None:
        raise UserError("terraform is not installed; install Terraform >= 1.9 "
                        "(https://developer.hashicorp.com/terraform/install) and run 'make up' again")
    return binary


def run_terraform(tf_dir: Path, *args: str) -> str:
    """``terraform -chdir=<tf_dir> <args>``; stdout returned, stderr streamed to the user."""
    binary = terraform_binary()
    argv = [binary, f"-chdir={tf_dir}", *args]
    log.info("running %s", " ".join(argv))
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, "TF_IN_AUTOMATION": "1"})
    if result.returncode != 0:
        raise UserError(f"'terraform {args[0]}' failed (exit code {result.returncode}) in {tf_dir}; see its output above")
    return result.stdout


Terraform = Callable[..., str]


class AwsProvider:
    name = "aws"

    def __init__(self, terraform: Terraform = run_terraform, ec2_client: Callable[[str], Any] = aws_ec2.client,
                 ssh_port: int = 22, wait_ssh: Callable[..., None] = aws_ec2.wait_tcp) -> None:
        self.terraform = terraform  # tests: the real binary against moto, or a stand-in for failure paths
        self.ec2_client = ec2_client
        # The readiness probe: (hosts, port, timeout). Tests aim it at a loopback listener, since
        # the addresses moto hands out must never be connected to.
        self.ssh_port = ssh_port
        self.wait_ssh = wait_ssh

    def confirm(self, spec: ClusterSpec, assume_yes: bool = False) -> None:
        """Print what the cluster costs per hour; ask unless ``assume_yes``."""
        settings = AwsSettings.from_spec(spec)
        print(cost_line(spec, settings, json.loads(PRICES.read_text())))
        print(f"nodes end themselves after {settings.ttl_hours} h (TTL_HOURS); 'make down' ends them sooner")
        if assume_yes:
            return
        if not sys.stdin.isatty():
            raise UserError("creating billable instances needs a confirmation; run 'make up YES=1' (or --yes)")
        if input("create them? [y/N] ").strip().lower() not in ("y", "yes"):
            raise UserError("not confirmed; nothing was created")

    # up ---------------------------------------------------------------------------------

    def up(self, spec: ClusterSpec, state: ClusterState) -> Inventory:
        settings = AwsSettings.from_spec(spec)
        if self.terraform is run_terraform:
            terraform_binary()  # the install hint before anything is written
        tf_dir = state.provider_dir / "terraform"
        # Written first: `down` finds region and Terraform state even if `up` dies half-way.
        tf_dir.mkdir(parents=True, exist_ok=True)
        (state.provider_dir / "aws.json").write_text(json.dumps({"region": settings.region, "cluster": spec.name}))
        for source in MODULE_DIR.iterdir():
            if source.is_file():
                shutil.copy2(source, tf_dir / source.name)
        host_keys = self._make_keys(spec, state)
        expires = (datetime.now(timezone.utc) + timedelta(hours=settings.ttl_hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        tfvars = {
            "cluster_name": spec.name, "region": settings.region, "cluster_type": spec.cluster_type,
            "instance_type": settings.instance_type, "nodes": spec.nodes, "ssh_cidr": settings.ssh_cidr,
            "ssh_public_key": Path(f"{state.ssh_key}.pub").read_text().strip(), "owner": settings.owner,
            "ttl_hours": settings.ttl_hours, "expires_at": expires, "spot": settings.spot, "image": settings.image,
            "host_keys": [{"private_key": private, "public_key": public} for private, public in host_keys],
        }
        _write_secret(tf_dir / "terraform.tfvars.json", json.dumps(tfvars, indent=2))  # holds private host keys
        try:
            return self._create(state, settings, host_keys)
        except BaseException:
            log.error("up failed; destroying what was created")
            try:
                self.down(state)
            except Exception as err:  # the original failure is the one to report
                print(f"cleanup after the failed up also failed: {err}", file=sys.stderr)
            raise

    def _make_keys(self, spec: ClusterSpec, state: ClusterState) -> list[tuple[str, str]]:
        if not state.ssh_key.exists():
            private, public = new_ed25519(f"multinode-{spec.name}")
            _write_secret(state.ssh_key, private)
            Path(f"{state.ssh_key}.pub").write_text(public + "\n")
        return [new_ed25519(f"{spec.name}-node-{i}") for i in range(spec.nodes)]

    def _create(self, state: ClusterState, settings: AwsSettings, host_keys: list[tuple[str, str]]) -> Inventory:
        tf_dir = state.provider_dir / "terraform"
        self.terraform(tf_dir, "init", "-input=false", "-no-color")
        self.terraform(tf_dir, "apply", "-input=false", "-auto-approve", "-no-color")
        outputs = json.loads(self.terraform(tf_dir, "output", "-json", "-no-color"))
        keys = {f"node-{i}": public for i, (_, public) in enumerate(host_keys)}
        inventory = inventory_from_outputs(outputs, state, keys, settings.image)
        ec2 = self.ec2_client(settings.region)
        aws_ec2.wait_status_ok(ec2, [n.instance_id for n in inventory.nodes], timeout=STATUS_TIMEOUT)
        self.wait_ssh([n.ssh_host for n in inventory.nodes], self.ssh_port, timeout=SSH_TIMEOUT)
        state.known_hosts.write_text("".join(known_hosts_lines(inventory)))
        inventory.save(state.inventory_path)
        return inventory

    # down -------------------------------------------------------------------------------

    def down(self, state: ClusterState) -> list[str]:
        meta_path = state.provider_dir / "aws.json"
        if not meta_path.exists():
            return [f"cluster {state.name!r}: no AWS state here; if instances leaked, run 'make reap REGION=<region>'"]
        try:
            region = json.loads(meta_path.read_text())["region"]
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{meta_path} is damaged; find and terminate the cluster's instances by their tags: "
                            f"make reap REGION=<region> CLUSTER={state.name} YES=1, then delete {state.root}") from None
        tf_dir = state.provider_dir / "terraform"
        lines = []
        if (tf_dir / "terraform.tfstate").exists() or (tf_dir / ".terraform").exists():
            self.terraform(tf_dir, "destroy", "-input=false", "-auto-approve", "-no-color")
            lines.append(f"terraform destroy of cluster {state.name!r} done")
        lines.extend(verify_gone(self.ec2_client(region), state.name, region))
        for path in (state.inventory_path, state.ssh_key, Path(f"{state.ssh_key}.pub"), state.known_hosts):
            path.unlink(missing_ok=True)
        shutil.rmtree(state.provider_dir, ignore_errors=True)
        return lines


def verify_gone(ec2, cluster: str, region: str) -> list[str]:
    """Lines saying nothing of ``cluster`` bills; UserError naming the leaked instances otherwise."""
    leaks = aws_ec2.tagged_instances(ec2, cluster)
    if leaks:
        raise UserError(
            f"cluster {cluster!r} still has instances in a billing state: "
            f"{', '.join(f'{i.instance_id} ({i.state})' for i in leaks)}; "
            f"run 'make reap REGION={region} CLUSTER={cluster} YES=1'")
    return [f"verified: no instance tagged cluster={cluster}, managed-by=multinode is pending, running, stopping or stopped in {region}"]


def reap(region: str, cluster: str | None = None, yes: bool = False, ec2: Any = None) -> list[str]:
    """Instances tagged managed-by=multinode (optionally of one cluster) still billing; terminate them with ``yes``."""
    ec2 = ec2 or aws_ec2.client(region)
    found = aws_ec2.tagged_instances(ec2, cluster)
    scope = f"cluster={cluster}, managed-by=multinode" if cluster else "managed-by=multinode"
    if not found:
        return [f"no instance tagged {scope} is billing in {region}"]
    lines = [i.describe() for i in found]
    if yes:
        aws_ec2.terminate(ec2, [i.instance_id for i in found])
        lines.append(f"terminated {len(found)} instances in {region}")
    else:
        lines.append(f"{len(found)} instances would be terminated; run 'make reap REGION={region} YES=1' to do it")
    return lines
