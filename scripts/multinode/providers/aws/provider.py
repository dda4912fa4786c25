"""The ``aws`` provider: an EC2 cluster from ``infra/ec2`` (Terraform), checked with boto3.

``up``: settings from ``spec.options`` or the environment (multinode.providers.aws.settings). A client
key, one ed25519 host key per node and a random cluster id are made here (multinode.providers.aws.keys),
so the host keys are pinned before the first connection (no trust-on-first-use; the trade-off: the
private host key travels in user data, readable via IMDS by anyone on the node). Then ``terraform
init/apply`` (multinode.providers.aws.terraform) on a copy of the module in
``.multinode/<cluster>/provider/`` (state stays there), boto3 waits for both status checks and for
port 22, the bootstrap wait (multinode.providers.aws.readiness) for every node's ready marker over SSH, and the
inventory is built from ``terraform output -json``. A failure half-way destroys what was made, then
re-raises.

``down``: ``terraform destroy``, then a sweep by tags (aws_sweep: also what Terraform's state lacks, and
everything when the local state is gone), then boto3 verifies that no instance tagged with the cluster
is left in a billing state (stopped counts: its EBS bills). ``reap`` (multinode.providers.aws.reap):
expired instances and the resources of clusters whose instances are gone, listed or deleted.

Before anything is made, ``up`` checks the account's vCPU quota for the instance family (multinode.providers.aws.quotas)
and finds the zones that offer the type: the cluster gets a subnet in each (infra/ec2/network.tf), its nodes start
in the first. EC2's refusals at ``up`` and at a replacement move the refused nodes out of the cluster placement group,
then to another zone, one line each (multinode.providers.aws.capacity, .placement, .refusals); a quota refusal is
named as one. The AWS provider's own retries are bounded (infra/ec2 ``max_retries`` = 3, not its 25), so a refusal
surfaces after a few tries instead of minutes of back-off, for the recovery's RECOVER_WAIT.

``replace`` (recovery of a lost node; multinode.providers.aws.replacing): the lost instance terminated if it still
bills, then ``terraform plan -replace/-target aws_instance.node[i]`` checked to touch that instance only, applied:
one new instance from the same configuration, with an expiry of its own (TTL_HOURS from its launch). How long the
cluster's nodes took from launch to ready (at ``up`` and at every replacement) is kept
(multinode.providers.aws.launches): :meth:`AwsProvider.replacement_estimate` is its median, which recovery weighs
against a restart of the job (wait, or go on with fewer nodes at once).

``AWS_ENDPOINT_URL`` sends both boto3 and Terraform's AWS provider to another endpoint (the tests:
a moto_server on loopback). Variables of infra/ec2 that multinode does not write (``ami_id``,
``placement_group``, ``vpc_id``/``subnet_id``, ``root_volume_gb``, ``tags``...) can be given as
``TF_VAR_<name>``; the ones it writes to terraform.tfvars.json take precedence over them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from multinode.core.config import ClusterSpec, env_default
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState
from multinode.providers.aws import capacity as aws_capacity
from multinode.providers.aws import ec2 as aws_ec2
from multinode.providers.aws import launches, quotas
from multinode.providers.aws import session as aws_session
from multinode.providers.aws import sweep as aws_sweep
from multinode.providers.aws.bootstrap_inputs import bootstrap_tfvars
from multinode.providers.aws.keys import new_ed25519, write_secret
from multinode.providers.aws.placement import first_layout
from multinode.providers.aws.reap import verify_gone
from multinode.providers.aws.replacing import SSH_TIMEOUT, STATUS_TIMEOUT, replace_node
from multinode.providers.aws.settings import AwsSettings, cost_line, ecr_repository_of, instance_type_for, prices_path
from multinode.providers.aws.readiness import wait_bootstrap
from multinode.providers.aws.terraform import (Terraform, inventory_from_outputs, known_hosts_lines, module_dir,
                                               run_terraform, terraform_binary)
from multinode.providers.base import Estimate

log = logging.getLogger(__name__)


class AwsProvider:
    name = "aws"

    def __init__(self, terraform: Terraform = run_terraform, ec2_client: Callable[[str], Any] = aws_ec2.client,
                 ssh_port: int = 22, wait_ssh: Callable[..., None] = aws_ec2.wait_tcp,
                 wait_ready: Callable[[Inventory, str | None], None] | None = None,
                 clients: Callable[[str], aws_sweep.Clients] = aws_sweep.Clients.for_region,
                 quotas_client: Callable[[str], Any] = functools.partial(aws_session.client, "service-quotas")) -> None:
        self.terraform = terraform  # tests: the real binary against moto, or a stand-in for failure paths
        self.ec2_client = ec2_client
        # The readiness probe: (hosts, port, timeout). Tests aim it at a loopback listener, since
        # the addresses moto hands out must never be connected to.
        self.ssh_port = ssh_port
        self.wait_ssh = wait_ssh
        # The bootstrap wait (multinode.providers.aws.readiness) over SSH; tests run it against local nodes.
        self.wait_ready = wait_ready or wait_bootstrap
        self.clients = clients  # EC2, IAM and ECR of a region: the sweep by tags of down and reap
        self.quotas_client = quotas_client  # Service Quotas of a region: the vCPU quota checked before up

    def confirm(self, spec: ClusterSpec, assume_yes: bool = False) -> None:
        """Print what the cluster costs per hour; ask unless ``assume_yes``."""
        settings = AwsSettings.from_spec(spec)
        print(cost_line(spec, settings, json.loads(prices_path().read_text())))
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
        itype = instance_type_for(spec, settings)
        ec2 = self.ec2_client(settings.region)
        layout = first_layout(aws_ec2.offered_zones(ec2, itype), itype, settings.region, dict(os.environ))
        quotas.check(ec2, self.quotas_client(settings.region), quotas.Need(itype, spec.nodes, settings.spot, settings.region))
        tf_dir = state.provider_dir / "terraform"
        # Written first: `down` finds region and Terraform state even if `up` dies half-way.
        tf_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = secrets.token_hex(3)  # account-wide names and the cluster-id tag: no collision between same-named clusters
        (state.provider_dir / "aws.json").write_text(
            json.dumps({"region": settings.region, "cluster": spec.name, "cluster_id": cluster_id}))
        for source in module_dir().iterdir():
            if source.is_file():
                shutil.copy2(source, tf_dir / source.name)
        host_keys = self._make_keys(spec, state)
        expires = (datetime.now(timezone.utc) + timedelta(hours=settings.ttl_hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        tfvars = {
            "cluster_name": spec.name, "cluster_id": cluster_id, "region": settings.region, "cluster_type": spec.cluster_type,
            "instance_type": settings.instance_type, "nodes": spec.nodes, "ssh_cidr": settings.ssh_cidr,
            "ssh_public_key": Path(f"{state.ssh_key}.pub").read_text().strip(), "owner": settings.owner,
            "ttl_hours": settings.ttl_hours, "expires_at": expires, "spot": settings.spot, "bucket_names": list(settings.buckets),
            "host_keys": [{"private_key": private, "public_key": public} for private, public in host_keys],
        }
        tfvars.update(bootstrap_tfvars(spec, settings))
        tfvars.update(layout)
        repository = settings.image and ecr_repository_of(settings.image, settings.region)
        if repository:
            tfvars["ecr_repository"] = repository  # the image's own repository, taken by name
        write_secret(tf_dir / "terraform.tfvars.json", json.dumps(tfvars, indent=2))  # holds private host keys
        try:
            return self._create(state, settings, host_keys)
        except aws_capacity.LaunchRefused as refused:
            self._clean_up(state)
            if refused.refusal.quota:
                raise UserError(f"{refused}; nothing is left of the cluster") from None
            raise
        except BaseException:
            self._clean_up(state)
            raise

    def _clean_up(self, state: ClusterState) -> None:
        log.error("up failed; destroying what was created")
        try:
            self.down(state)
        except Exception as err:  # the original failure is the one to report
            print(f"cleanup after the failed up also failed: {err}", file=sys.stderr)

    def _make_keys(self, spec: ClusterSpec, state: ClusterState) -> list[tuple[str, str]]:
        if not state.ssh_key.exists():
            private, public = new_ed25519(f"multinode-{spec.name}")
            write_secret(state.ssh_key, private)
            Path(f"{state.ssh_key}.pub").write_text(public + "\n")
        return [new_ed25519(f"{spec.name}-node-{i}") for i in range(spec.nodes)]

    def _create(self, state: ClusterState, settings: AwsSettings, host_keys: list[tuple[str, str]]) -> Inventory:
        tf_dir = state.provider_dir / "terraform"
        self.terraform(tf_dir, "init", "-input=false", "-no-color")
        aws_capacity.apply_all(self.terraform, tf_dir)
        outputs = json.loads(self.terraform(tf_dir, "output", "-json", "-no-color"))
        keys = {f"node-{i}": public for i, (_, public) in enumerate(host_keys)}
        inventory = inventory_from_outputs(outputs, state, keys, settings.image)
        ec2 = self.ec2_client(settings.region)
        aws_ec2.wait_status_ok(ec2, [n.instance_id for n in inventory.nodes], timeout=STATUS_TIMEOUT)
        self.wait_ssh([n.ssh_host for n in inventory.nodes], self.ssh_port, timeout=SSH_TIMEOUT)
        state.known_hosts.write_text("".join(known_hosts_lines(inventory)))
        self.wait_ready(inventory, settings.image)
        launches.record(state.provider_dir, ec2, inventory.nodes, "up", launches.now())
        inventory.save(state.inventory_path)
        return inventory

    # replace ----------------------------------------------------------------------------

    def replacement_estimate(self, state: ClusterState, inventory: Inventory) -> Estimate:
        """The median of how long this cluster's own nodes took from launch to ready (multinode.providers.aws.launches),
        or a published lower bound before there is one."""
        return launches.estimate(state.provider_dir, inventory.extra.get("instance_types") or ())

    def gone(self, state: ClusterState, inventory: Inventory, names: list[str]) -> dict[str, str]:
        """The nodes whose instance EC2 no longer runs (terminated, shutting down, stopped), by DescribeInstances."""
        ids = {n.instance_id: n.name for n in inventory.nodes if n.name in names and n.instance_id}
        region = json.loads((state.provider_dir / "aws.json").read_text())["region"]
        return {ids[i]: f"its instance is {st}" for i, st in aws_ec2.not_running(self.ec2_client(region), list(ids)).items()}

    def replace(self, state: ClusterState, inventory: Inventory, name: str, retire=None) -> Inventory:
        """One new instance for node ``name`` (multinode.providers.aws.replacing); the other instances are not
        touched. CapacityRefused when EC2 refuses it wherever it may go, or for a quota. ``retire(False)`` is
        called first: the node's instance index is one machine, so the old instance ends before the new one
        launches."""
        if retire is not None:
            retire(False)
        return replace_node(self, state, inventory, name)

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


__all__ = ["AwsProvider", "wait_bootstrap"]
