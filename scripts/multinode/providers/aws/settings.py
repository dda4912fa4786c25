"""What ``make up PROVIDER=aws`` is asked for: the settings (validated once), the image's registry, the price.

Settings come from ``spec.options`` or MULTINODE_REGION, MULTINODE_SSH_CIDR, MULTINODE_TTL_HOURS,
MULTINODE_SPOT, MULTINODE_OWNER, MULTINODE_IMAGE. No image: jobs run in the host runtime (the bootstrap
installs torch, Open MPI and mpi4py on every node); an image reference without a registry host is refused
(the nodes could not pull it). The cost line reads ``infra/prices.json``: the instances, their public IPv4
addresses and their gp3 root volumes.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multinode.core.config import BUCKET, ClusterSpec
from multinode.core.errors import UserError
from multinode.core.resources import infra_dir
from multinode.core.settings import AWS
from multinode.core.sources import value_of

FIX = "make up PROVIDER=aws SSH_CIDR=203.0.113.4/32 REGION=us-east-1"
# Declared once, with the other settings; each by its -o key (the image's is "image", its variable IMAGE_REF's).
DECLARED = {setting.name.removesuffix("_ref"): setting for setting in AWS}
ROOT_VOLUME_GB = 100  # infra/ec2/variables.tf root_volume_gb's default (TF_VAR_root_volume_gb overrides it)


def prices_path() -> Path:
    """``infra/prices.json``, where it ships (:mod:`multinode.core.resources`)."""
    return infra_dir() / "prices.json"


@dataclass(frozen=True)
class AwsSettings:
    """The AWS-specific part of ``up``, validated once."""

    region: str
    ssh_cidr: str
    ttl_hours: int
    spot: bool
    owner: str
    image: str | None  # None: the host runtime
    instance_type: str | None
    buckets: tuple[str, ...] = ()  # the S3 buckets the nodes' role may use (infra/ec2/registry.tf)

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> "AwsSettings":
        opts = spec.options

        def pick(key: str) -> Any:
            """``-o key=value`` > ``MULTINODE_<KEY>`` > the declared default, typed by its declaration
            (:data:`multinode.core.settings.AWS`: a bad SPOT or TTL_HOURS is the kind's one line)."""
            return value_of(DECLARED[key], opts.get(key) or None, os.environ)

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
        ttl = pick("ttl_hours")
        if not 1 <= ttl <= 72:
            raise UserError(f"TTL_HOURS='{ttl}' must be a whole number from 1 to 72")
        image = pick("image")
        if image is not None and registry_of(image) is None:
            kind = {"cpu": "cpu", "g4dn": "cuda", "g4ad": "rocm"}[spec.cluster_type]
            raise UserError(
                f"IMAGE_REF={image} is a local tag the nodes cannot pull; push it first: 'make image IMAGE={kind} PUSH=1 "
                f"ECR=<account>.dkr.ecr.{region}.amazonaws.com', then 'make up ... IMAGE_REF=<account>.dkr.ecr."
                f"{region}.amazonaws.com/multinode-{kind}:latest', or leave IMAGE_REF unset to run jobs in the host runtime")
        buckets = tuple((pick("buckets") or "").replace(",", " ").split())
        for name in buckets:
            if not BUCKET.match(name):
                raise UserError(f"BUCKETS: {name!r} is not an S3 bucket name (3-63 lower-case letters, digits, dots and "
                                f"hyphens); give the names alone, e.g. BUCKETS=\"my-data my-checkpoints\"")
        return cls(region=region, ssh_cidr=str(net), ttl_hours=ttl, spot=pick("spot"),
                   owner=pick("owner") or getpass.getuser(),
                   image=image,
                   instance_type=pick("instance_type"), buckets=buckets)


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


DEFAULT_INSTANCE_TYPES = {"cpu": "c6i.xlarge", "g4dn": "g4dn.xlarge", "g4ad": "g4ad.xlarge"}  # infra/ec2/main.tf


def instance_type_for(spec: ClusterSpec, settings: AwsSettings) -> str:
    return settings.instance_type or DEFAULT_INSTANCE_TYPES[spec.cluster_type]


def root_volume_gb() -> int:
    """Each node's root volume size: TF_VAR_root_volume_gb (the module's override) or its default."""
    value = os.environ.get("TF_VAR_root_volume_gb") or str(ROOT_VOLUME_GB)
    if not value.isdigit():
        raise UserError(f"TF_VAR_root_volume_gb={value!r} must be a whole number of GiB, e.g. 100")
    return int(value)


def cost_line(spec: ClusterSpec, settings: AwsSettings, prices: dict[str, Any]) -> str:
    """``2 x g4dn.xlarge on-demand $1.05/h + 2 public IPv4 $0.01/h + 2 x 100 GiB gp3 $0.02/h = $1.08/h (...)``
    from infra/prices.json; a part without a price for the region is named, never guessed."""
    itype = instance_type_for(spec, settings)
    market = "spot" if settings.spot else "on-demand"
    region, nodes = settings.region, spec.nodes
    table = prices["on_demand_usd_per_hour"].get(region, {})
    if itype not in table:
        return (f"{nodes} x {itype} {market} = price unknown (no entry for {region} in "
                f"infra/prices.json); check https://aws.amazon.com/ec2/pricing/on-demand/")
    instances = nodes * table[itype]
    ipv4 = nodes * prices["public_ipv4_usd_per_hour"]  # one public address per node (compute.tf)
    size = root_volume_gb()
    parts = [f"{nodes} x {itype} {market} ${instances:.2f}/h", f"{nodes} public IPv4 ${ipv4:.2f}/h"]
    total = instances + ipv4
    gp3 = prices["gp3_usd_per_gb_month"].get(region)
    if gp3 is None:
        parts.append(f"{nodes} x {size} GiB gp3 (no price for {region} in infra/prices.json)")
    else:
        storage = nodes * size * gp3 / prices["hours_per_month"]
        parts.append(f"{nodes} x {size} GiB gp3 ${storage:.2f}/h")
        total += storage
    note = ", spot is usually lower: this is its ceiling" if settings.spot else ""
    return f"{' + '.join(parts)} = ${total:.2f}/h (prices of {prices['date']}, {region}{note})"
