"""What ``make up PROVIDER=aws`` is asked for: the settings (validated once), the image's registry, the price.

Settings come from ``spec.options`` or MULTINODE_REGION, MULTINODE_SSH_CIDR, MULTINODE_TTL_HOURS,
MULTINODE_SPOT, MULTINODE_OWNER, MULTINODE_IMAGE; an image reference without a registry host is
refused (the nodes could not pull it). The cost line reads ``infra/prices.json``.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multinode.core.config import ClusterSpec, env_default
from multinode.core.errors import UserError

PRICES = Path(__file__).resolve().parents[4] / "infra" / "prices.json"
FIX = "make up PROVIDER=aws SSH_CIDR=203.0.113.4/32 REGION=us-east-1"
DEFAULT_IMAGES = {"cpu": "multinode-cpu:latest", "g4dn": "multinode-cuda:latest", "g4ad": "multinode-rocm:latest"}


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
