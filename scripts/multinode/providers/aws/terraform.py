"""Terraform for the ``aws`` provider: running it on the cluster's copy of ``infra/ec2``, and reading
its ``inventory`` output (the contract of ``infra/ec2/outputs.tf``) into an Inventory.

``AWS_ENDPOINT_URL`` sends Terraform's AWS provider to another endpoint (the tests: a moto_server on
loopback). Variables of infra/ec2 that multinode does not write (``ami_id``, ``placement_group``,
``vpc_id``/``subnet_id``, ``root_volume_gb``, ``tags``...) can be given as ``TF_VAR_<name>``; the ones
it writes to terraform.tfvars.json take precedence over them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, Node
from multinode.core.resources import infra_dir
from multinode.core.progress import Progress
from multinode.core.state import ClusterState

log = logging.getLogger(__name__)

WORKDIR = "/opt/multinode"
MPI_SSH_PORT = 2222  # the images' sshd (docker/sshd_config)
HOST_PYTHON = f"{WORKDIR}/venv/bin/python"  # the host runtime's virtualenv (infra/ec2/user_data.sh.tftpl)


def module_dir() -> Path:
    """The Terraform module ``infra/ec2``, where it ships (:mod:`multinode.core.resources`); ``up`` copies its files
    into the cluster's state directory and runs Terraform there."""
    return infra_dir() / "ec2"


def terraform_binary() -> str:
    binary = shutil.which("terraform")
    if binary is None:
        raise UserError("terraform is not installed; install Terraform >= 1.9 "
                        "(https://developer.hashicorp.com/terraform/install) and run 'make up' again")
    return binary


class TerraformFailed(UserError):
    """A terraform command failed; ``output`` is what it wrote to stderr (EC2's error codes are in it)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def run_terraform(tf_dir: Path, *args: str) -> str:
    """``terraform -chdir=<tf_dir> <args>``; stdout returned, stderr passed on to the user (and kept in
    :class:`TerraformFailed` when the command fails). While an apply or a destroy runs, each resource's progress
    line (``aws_instance.node[1]: Still creating... [20s elapsed]``) is shown as it comes (:mod:`multinode.core.progress`:
    one updating line on a terminal, plain lines otherwise)."""
    binary = terraform_binary()
    argv = [binary, f"-chdir={tf_dir}", *args]
    log.info("running %s", " ".join(argv))
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as errors, Progress(f"terraform {args[0]}") as progress:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True,
                                env={**os.environ, "TF_IN_AUTOMATION": "1"})
        for line in proc.stdout:
            lines.append(line)
            if args[0] in LONG_COMMANDS and RESOURCE_PROGRESS.match(line):
                progress.update(line.strip())
        code = proc.wait()
        errors.seek(0)
        stderr = errors.read()
    sys.stderr.write(stderr)
    if code != 0:
        raise TerraformFailed(f"'terraform {args[0]}' failed (exit code {code}) in {tf_dir}; "
                              "see its output above", stderr)
    return "".join(lines)


Terraform = Callable[..., str]
LONG_COMMANDS = ("apply", "destroy")
# Terraform's line per resource as an apply or destroy goes (its human-readable output, -no-color): e.g.
# "aws_instance.node[0]: Creating...", "...: Still creating... [10s elapsed]", "...: Creation complete after 12s".
RESOURCE_PROGRESS = re.compile(r"^(module\.\S+\.)?[\w-]+\.[\w-]+(\[[^\]]+\])?: (Creat|Still |Destr|Modif|Read)")


# --- outputs -> inventory -----------------------------------------------------------------


def inventory_from_outputs(outputs: dict, state: ClusterState, host_keys: dict[str, str], image: str | None) -> Inventory:
    """Build the inventory from ``terraform output -json`` (the ``inventory`` output of infra/ec2); ``image``
    None is the host runtime (the bootstrap's virtualenv), else the docker runtime of that image."""
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
        # MODE=mpi: mpirun on the head reads the cluster key and known_hosts from the work directory
        # (code.credentials puts them there): the host's sshd on 22, or in the image's sshd on 2222
        # (runtimes.mpi_sshd_shell; the host's own sshd keeps 22), so the remote ranks run in the image too.
        extra = {"mpi_ssh_port": 22 if image is None else MPI_SSH_PORT, "mpi_ssh_key": f"{WORKDIR}/.ssh/id_ed25519",
                 "mpi_known_hosts": f"{WORKDIR}/.ssh/known_hosts", "region": value["region"],
                 "cluster_id": value["cluster_id"], "zone": value["zone"],
                 "ecr_repository_url": value["ecr"]["repository_url"],
                 "ecr_created": bool(value["ecr"]["created_by_us"]), "instance_role": value["ecr"]["instance_role"],
                 "instance_types": sorted({n["instance_type"] for n in value["nodes"]})}
        if image is not None:
            extra["container_python"] = "python3"
        return Inventory(
            cluster=value["cluster"], provider="aws", nodes=nodes, subnet=value["subnet_cidr"],
            ssh_key=str(state.ssh_key), known_hosts=str(state.known_hosts), workdir=WORKDIR,
            python=HOST_PYTHON if image is None else "python3", runtime="host" if image is None else "docker",
            image=image, extra=extra,
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
