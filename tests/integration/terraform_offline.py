"""The real Terraform binary with the AWS provider from a local filesystem mirror (no registry here).

``terraform_env`` returns the environment for running the binary offline: a CLI config whose only
provider source is the mirror, no update check (it would resolve checkpoint-api.hashicorp.com),
and no trust in whatever ``TF_CLI_CONFIG_FILE`` the machine has. The mirror must hold exactly the
version pinned in ``infra/ec2/.terraform.lock.hcl``; if the binary or the mirror is missing, the
test fails naming what to install (never a skip).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "infra" / "ec2"
MIRROR = Path(os.environ.get("MULTINODE_TF_PLUGIN_MIRROR", "/opt/tf-plugins"))
MIN_TERRAFORM = (1, 9)  # infra/ec2/versions.tf: required_version


def locked_aws_version() -> str:
    lock = (MODULE / ".terraform.lock.hcl").read_text()
    return re.search(r'provider "registry.terraform.io/hashicorp/aws" \{\s*version\s*=\s*"([^"]+)"', lock).group(1)


def terraform_binary() -> str:
    """Path of a terraform >= 1.9 on PATH (no stand-in library: README says these tests need the binary);
    pytest.fail in one line naming it when it is missing or older."""
    binary = shutil.which("terraform")
    if binary is None:
        pytest.fail("terraform >= 1.9 is not on PATH: these tests run the real binary (this project's machine "
                    "has it at /usr/local/bin/terraform; elsewhere install it from "
                    "https://developer.hashicorp.com/terraform/install)", pytrace=False)
    out = subprocess.run([binary, "version", "-json"], capture_output=True, text=True,
                         env={**os.environ, "CHECKPOINT_DISABLE": "1"}).stdout
    found = re.search(r'"terraform_version":\s*"(\d+)\.(\d+)', out)
    if not found or tuple(map(int, found.groups())) < MIN_TERRAFORM:
        pytest.fail(f"{binary} is not terraform >= 1.9 (version output: {out.strip()[:200]!r})", pytrace=False)
    return binary


def require_terraform() -> str:
    """Path of a terraform >= 1.9 whose AWS provider is in the mirror; pytest.fail naming what is missing."""
    binary = terraform_binary()
    version = locked_aws_version()
    plugin = MIRROR / "registry.terraform.io" / "hashicorp" / "aws" / version / "linux_amd64"
    if not any(plugin.glob("terraform-provider-aws_*")):
        pytest.fail(f"the AWS provider {version} (pinned in infra/ec2/.terraform.lock.hcl) is not in the "
                    f"filesystem mirror: {plugin} is missing. Put it there (unpacked layout, e.g. "
                    f"'terraform providers mirror' on a machine with registry access) or point "
                    f"MULTINODE_TF_PLUGIN_MIRROR at a mirror that has it", pytrace=False)
    return binary


def terraform_env(workdir: Path) -> dict[str, str]:
    """Environment additions for an offline terraform: the mirror is the only provider source."""
    config = workdir / "terraform-offline.tfrc"
    config.write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{MIRROR}"\n'
        '    include = ["registry.terraform.io/hashicorp/aws"]\n  }\n}\n')
    return {"TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
