"""The ``aws`` provider: an EC2 cluster from ``infra/ec2`` (Terraform), checked with boto3.

``up``: settings from ``spec.options`` (or MULTINODE_REGION, MULTINODE_SSH_CIDR, MULTINODE_TTL_HOURS,
MULTINODE_SPOT, MULTINODE_OWNER, MULTINODE_IMAGE); an image reference without a registry host is
refused (the nodes could not pull it). A client key, one ed25519 host key per node and a random
cluster id are made here, so the host keys are pinned before the first connection (no
trust-on-first-use; the trade-off: the private host key travels in user data, readable via IMDS by
anyone on the node). Then ``terraform init/apply`` on a copy of the module in
``.multinode/<cluster>/provider/`` (state stays there), boto3 waits for both status checks and for
port 22, the bootstrap wait (multinode.providers.aws.readiness) for every node's ready marker over SSH, and the
inventory is built from ``terraform output -json``. A failure half-way destroys what was made, then
re-raises.

``down``: ``terraform destroy``, then a sweep by tags (aws_sweep: also what Terraform's state lacks, and
everything when the local state is gone), then boto3 verifies that no instance tagged with the cluster
is left in a billing state (stopped counts: its EBS bills). ``reap``: expired instances and the
resources of clusters whose instances are gone, listed or deleted.

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
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from multinode.core.config import ClusterSpec, env_default
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, Node
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import sweep as aws_sweep
from multinode.core.state import ClusterState

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[4]
MODULE_DIR = REPO / "infra" / "ec2"
PRICES = REPO / "infra" / "prices.json"
WORKDIR = "/opt/multinode"
MPI_SSH_PORT = 2222  # the images' sshd (docker/sshd_config)
FIX = "make up PROVIDER=aws SSH_CIDR=203.0.113.4/32 REGION=us-east-1"
DEFAULT_IMAGES = {"cpu": "multinode-cpu:latest", "g4dn": "multinode-cuda:latest", "g4ad": "multinode-rocm:latest"}
STATUS_TIMEOUT = 900.0  # seconds for every node to pass its status checks
SSH_TIMEOUT = 300.0
# seconds for every bootstrap to finish after SSH answers: apt behind unattended-upgrades, a DKMS
# build on g4ad, a pull of a multi-GB GPU image.
READY_TIMEOUT = 2400.0


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
        image = pick("image") or DEFAULT_IMAGES[spec.cluster_type]
        if registry_of(image) is None:
            kind = {"cpu": "cpu", "g4dn": "cuda", "g4ad": "rocm"}[spec.cluster_type]
            raise UserError(
                f"IMAGE_REF={image} is a local tag the nodes cannot pull; push it first: 'make image IMAGE={kind} PUSH=1 "
                f"ECR=<account>.dkr.ecr.{region}.amazonaws.com', then 'make up ... IMAGE_REF=<account>.dkr.ecr."
                f"{region}.amazonaws.com/multinode-{kind}:latest'")
        spot = pick("spot", "0").lower()
        if spot not in ("0", "1", "true", "false", "yes", "no"):
            raise UserError(f"SPOT={spot!r} must be 1 or 0")
        return cls(region=region, ssh_cidr=str(net), ttl_hours=int(ttl), spot=spot in ("1", "true", "yes"),
                   owner=pick("owner") or getpass.getuser(),
                   image=image,
                   instance_type=pick("instance_type"))


# --- images --------------------------------------------------------------------------------

ECR_REGISTRY = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")


def registry_of(image: str) -> str | None:
    """The registry host of an image reference, or None for a local-only tag (Docker's rule: the first
    path component is a host when it has a '.' or a ':' or is 'localhost')."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def ecr_repository_of(image: str, region: str) -> str | None:
    """The repository name when ``image`` lives in an ECR registry of ``region`` (Terraform then takes
    that repository by name instead of making one); None otherwise."""
    registry = registry_of(image)
    found = ECR_REGISTRY.match(registry or "")
    if not found or found["region"] != region:
        return None
    path = image.split("/", 1)[1].split("@", 1)[0]
    return path.rsplit(":", 1)[0] if ":" in path.rsplit("/", 1)[-1] else path


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
                   "cluster_id": value["cluster_id"], "zone": value["zone"],
                   "ecr_repository_url": value["ecr"]["repository_url"],
                   "ecr_created": bool(value["ecr"]["created_by_us"]), "instance_role": value["ecr"]["instance_role"],
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
                 ssh_port: int = 22, wait_ssh: Callable[..., None] = aws_ec2.wait_tcp,
                 wait_ready: Callable[[Inventory, str], None] | None = None,
                 clients: Callable[[str], aws_sweep.Clients] = aws_sweep.Clients.for_region) -> None:
        self.terraform = terraform  # tests: the real binary against moto, or a stand-in for failure paths
        self.ec2_client = ec2_client
        # The readiness probe: (hosts, port, timeout). Tests aim it at a loopback listener, since
        # the addresses moto hands out must never be connected to.
        self.ssh_port = ssh_port
        self.wait_ssh = wait_ssh
        # The bootstrap wait (multinode.providers.aws.readiness) over SSH; tests run it against local nodes.
        self.wait_ready = wait_ready or wait_bootstrap
        self.clients = clients  # EC2, IAM and ECR of a region: the sweep by tags of down and reap

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
        cluster_id = secrets.token_hex(3)  # account-wide names and the cluster-id tag: no collision between same-named clusters
        (state.provider_dir / "aws.json").write_text(
            json.dumps({"region": settings.region, "cluster": spec.name, "cluster_id": cluster_id}))
        for source in MODULE_DIR.iterdir():
            if source.is_file():
                shutil.copy2(source, tf_dir / source.name)
        host_keys = self._make_keys(spec, state)
        expires = (datetime.now(timezone.utc) + timedelta(hours=settings.ttl_hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        tfvars = {
            "cluster_name": spec.name, "cluster_id": cluster_id, "region": settings.region, "cluster_type": spec.cluster_type,
            "instance_type": settings.instance_type, "nodes": spec.nodes, "ssh_cidr": settings.ssh_cidr,
            "ssh_public_key": Path(f"{state.ssh_key}.pub").read_text().strip(), "owner": settings.owner,
            "ttl_hours": settings.ttl_hours, "expires_at": expires, "spot": settings.spot, "image": settings.image,
            "host_keys": [{"private_key": private, "public_key": public} for private, public in host_keys],
        }
        repository = ecr_repository_of(settings.image, settings.region)
        if repository:
            tfvars["ecr_repository"] = repository  # the image's own repository, taken by name
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
        self.wait_ready(inventory, settings.image)
        inventory.save(state.inventory_path)
        return inventory

    # down -------------------------------------------------------------------------------

    def down(self, state: ClusterState, yes: bool = False) -> list[str]:
        """terraform destroy (when local state exists), then a sweep by tags of whatever is left (all of
        it when the local state is gone), then the leak check. An ECR repository made for the cluster
        that still holds images is kept unless ``yes``."""
        meta_path = state.provider_dir / "aws.json"
        meta = None
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                region, target = meta["region"], aws_sweep.Target(state.name, meta.get("cluster_id"))
            except (OSError, ValueError, KeyError, TypeError):
                meta = None  # damaged: fall back to finding the cluster by its tags
        if meta is None:
            region = env_default("REGION")
            if not region and meta_path.exists():
                raise UserError(f"{meta_path} is damaged; delete the cluster by its tags: "
                                f"make down PROVIDER=aws CLUSTER={state.name} REGION=<region>")
            if not region:
                return [f"cluster {state.name!r}: no AWS state here; to delete it by its tags run "
                        f"'make down PROVIDER=aws CLUSTER={state.name} REGION=<region>'"]
            target = aws_sweep.Target(state.name)  # every cluster of this name in the region
        tf_dir = state.provider_dir / "terraform"
        lines = []
        if (tf_dir / "terraform.tfstate").exists() or (tf_dir / ".terraform").exists():
            # The repository is left to the sweep, which keeps it while it holds images.
            if "aws_ecr_repository.cluster[0]" in self.terraform(tf_dir, "state", "list", "-no-color").split():
                self.terraform(tf_dir, "state", "rm", "-no-color", "aws_ecr_repository.cluster[0]")
            self.terraform(tf_dir, "destroy", "-input=false", "-auto-approve", "-no-color")
            lines.append(f"terraform destroy of cluster {state.name!r} done")
        lines.extend(aws_sweep.sweep(self.clients(region), target, delete_images=yes))
        lines.extend(verify_gone(self.ec2_client(region), state.name, region, target.cluster_id))
        for path in (state.inventory_path, state.ssh_key, Path(f"{state.ssh_key}.pub"), state.known_hosts):
            path.unlink(missing_ok=True)
        shutil.rmtree(state.provider_dir, ignore_errors=True)
        return lines


def wait_bootstrap(inventory: Inventory, image: str) -> None:
    """Every node's bootstrap done (ready marker, image, GPUs, cloud-init) within READY_TIMEOUT."""
    from multinode.providers.aws.readiness import wait_ready
    from multinode.ssh.runner import RemoteRunner

    with RemoteRunner(inventory) as runner:
        runner.say(f"waiting up to {READY_TIMEOUT / 60:.0f} min for the bootstrap of {len(inventory.nodes)} nodes "
                   f"(Docker, driver, {image}, GPU check)")
        took = wait_ready(inventory, runner, image=image, timeout=READY_TIMEOUT, poll=10.0, say=runner.say)
        runner.say(f"every node is ready after {took:.0f}s")


def verify_gone(ec2, cluster: str, region: str, cluster_id: str | None = None) -> list[str]:
    """Lines saying nothing of ``cluster`` (of that id, when given) bills; UserError naming the leaked instances otherwise."""
    leaks = [i for i in aws_ec2.tagged_instances(ec2, cluster) if cluster_id in (None, i.cluster_id)]
    scope = f"cluster={cluster}" + (f", cluster-id={cluster_id}" if cluster_id else "")
    if leaks:
        raise UserError(
            f"cluster {cluster!r} still has instances in a billing state: "
            f"{', '.join(f'{i.instance_id} ({i.state})' for i in leaks)}; "
            f"run 'make reap REGION={region} CLUSTER={cluster} YES=1'")
    return [f"verified: no instance tagged {scope}, managed-by=multinode is pending, running, stopping or stopped in {region}"]


def expired(expiry: str, now: datetime) -> bool:
    """Whether an ``expiry`` tag lies in the past; an unreadable one counts as expired (nobody's cluster)."""
    try:
        return datetime.fromisoformat(expiry.replace("Z", "+00:00")) <= now
    except ValueError:
        return True


def reap(region: str, cluster: str | None = None, yes: bool = False, ec2: Any = None,
         clients: aws_sweep.Clients | None = None, now: datetime | None = None) -> list[str]:
    """What multinode left behind in ``region`` (optionally of one cluster): instances still billing after
    their expiry tag (their TTL timer did not end them), and the tagged resources of clusters with no
    instance left (ended by their TTL). With ``yes`` they are terminated and deleted; an ECR repository
    that holds images is kept, as by ``down``. Clusters within their TTL are left alone."""
    ec2 = ec2 or aws_ec2.client(region)
    clients = clients or aws_sweep.Clients.for_region(region)
    now = now or datetime.now(timezone.utc)
    every = aws_ec2.tagged_instances(ec2, cluster)
    found = [i for i in every if expired(i.expiry, now)]
    scope = f"cluster={cluster}, managed-by=multinode" if cluster else "managed-by=multinode"
    lines = [i.describe() for i in found]
    if yes and found:
        aws_ec2.terminate(ec2, [i.instance_id for i in found])
        lines.append(f"terminated {len(found)} instances in {region}")
    billing = {(i.cluster, i.cluster_id) for i in aws_ec2.tagged_instances(ec2, cluster)}
    orphans = [t for t in aws_sweep.leftover_targets(clients, cluster) if (t.cluster, t.cluster_id) not in billing]
    for target in orphans:
        if yes:
            lines.extend(f"{target.describe()}: {line}" for line in aws_sweep.sweep(clients, target))
        else:
            lines.append(f"{target.describe()}: network, key pair, IAM role and ECR repository left behind (no instance)")
    alive = len(every) - len(found)
    if not found and not orphans:
        return [f"no expired instance or other leftover tagged {scope} in {region}"
                + (f" ({alive} instances within their TTL left alone)" if alive else "")]
    if not yes:
        lines.append(f"{len(found)} instances would be terminated and {len(orphans)} clusters' resources deleted; "
                     f"run 'make reap REGION={region} YES=1' to do it")
    return lines
