"""Checks of infra/ that run without an AWS account or registry access: terraform fmt
(the terraform binary: without it these tests fail naming it, as README says), the real ``terraform init`` from the local provider mirror
against the committed lock file + ``terraform validate``, HCL structure (python-hcl2), the
outputs <-> inventory parser contract, checkov with zero unexplained failures, and every
validation rule evaluated by Terraform itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import hcl2
import pytest
from hcl2 import SerializationOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from terraform_offline import locked_aws_version, require_terraform, terraform_binary, terraform_env  # noqa: E402
from test_aws_inventory import KEYS, OUTPUTS  # noqa: E402  (the realistic output fixture)

from multinode.core.errors import UserError  # noqa: E402
from multinode.providers.aws.terraform import inventory_from_outputs  # noqa: E402
from multinode.core.state import ClusterState  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
MODULE = INFRA / "ec2"
CHECKOV = REPO / ".venv" / "checkov" / "bin" / "checkov"


@pytest.fixture(autouse=True)
def _no_update_check(monkeypatch):
    """terraform would otherwise resolve checkpoint-api.hashicorp.com: traffic stays on loopback."""
    monkeypatch.setenv("CHECKPOINT_DISABLE", "1")


def _parse(path: Path) -> dict:
    return hcl2.loads(path.read_text(),
                      serialization_options=SerializationOptions(strip_string_quotes=True, explicit_blocks=False))


def _blocks(kind: str) -> dict[str, dict]:
    found = {}
    for path in sorted(MODULE.glob("*.tf")):
        for block in _parse(path).get(kind, []):
            found.update(block)
    return found


def test_terraform_fmt_is_clean():
    tf = terraform_binary()
    result = subprocess.run([tf, "fmt", "-check", "-recursive", "-diff", str(INFRA)], capture_output=True, text=True)
    assert result.returncode == 0, f"run 'terraform fmt -recursive infra':\n{result.stdout}"


def test_terraform_init_from_the_lock_file_and_validate(tmp_path):
    """The real binary and provider: init must take exactly the locked version (readonly lock file,
    so a hash or constraint mismatch fails), then validate the whole module with its provider schema."""
    terraform = require_terraform()
    work = tmp_path / "ec2"
    shutil.copytree(MODULE, work)
    env = {**os.environ, **terraform_env(tmp_path)}
    init = subprocess.run([terraform, f"-chdir={work}", "init", "-input=false", "-no-color", "-lockfile=readonly"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    assert f"Installed hashicorp/aws v{locked_aws_version()}" in init.stdout
    assert (work / ".terraform.lock.hcl").read_text() == (MODULE / ".terraform.lock.hcl").read_text()
    validate = subprocess.run([terraform, f"-chdir={work}", "validate", "-json", "-no-color"],
                              capture_output=True, text=True, env=env, timeout=120)
    report = json.loads(validate.stdout)
    assert report["valid"] and report["error_count"] == 0, report["diagnostics"]
    assert report["warning_count"] == 0, report["diagnostics"]  # e.g. a deprecated attribute


def test_every_tf_file_parses_and_the_layout_is_complete():
    names = {p.name for p in MODULE.glob("*.tf")}
    assert {"versions.tf", "variables.tf", "main.tf", "network.tf", "security.tf", "compute.tf", "outputs.tf"} <= names
    for path in MODULE.glob("*.tf"):
        _parse(path)
    for example in ("cpu", "g4dn", "g4ad"):
        assert _parse(MODULE / "examples" / f"{example}.tfvars")["cluster_type"] == example


def test_every_variable_has_type_description_and_actionable_validations():
    variables = _blocks("variable")
    assert len(variables) >= 10
    for name, body in variables.items():
        assert body.get("type") and body.get("description"), f"variable {name} needs type and description"
        for rule in body.get("validation", []):
            assert len(rule.get("error_message", "")) > 20, f"variable {name}: validation without an error_message"
    validated = {n for n, b in variables.items() if b.get("validation")}
    assert {"nodes", "ssh_cidr", "cluster_type", "instance_type", "ttl_hours"} <= validated
    assert "default" not in variables["ssh_cidr"]  # the user must say where SSH may come from
    assert variables["host_keys"].get("sensitive") is True
    assert "64" in variables["nodes"]["validation"][0]["condition"]
    assert "0.0.0.0/0" in variables["ssh_cidr"]["validation"][0]["condition"]


def test_instances_are_hardened_and_end_themselves():
    resources = {}
    for path in MODULE.glob("*.tf"):
        for block in _parse(path).get("resource", []):
            for kind, named in block.items():
                resources.setdefault(kind, {}).update(named)
    node = resources["aws_instance"]["node"]
    assert node["metadata_options"][0]["http_tokens"] == "required"
    assert node["root_block_device"][0]["encrypted"] is True
    assert node["instance_initiated_shutdown_behavior"] == "terminate"
    template = (MODULE / "user_data.sh.tftpl").read_text()
    assert re.search(r"^OnCalendar=\$\{expiry_calendar\}$", template, re.M)  # the TTL timer (test_bootstrap.py)
    ingress = {name: rule for name, rule in resources["aws_vpc_security_group_ingress_rule"].items()}
    assert ingress["ssh"]["cidr_ipv4"] == "${var.ssh_cidr}" and ingress["ssh"]["from_port"] == 22
    assert set(ingress) == {"ssh", "cluster"} and "cidr_ipv4" not in ingress["cluster"]
    main = _parse(MODULE / "main.tf")
    tags = main["locals"][0]["tags"]
    assert all(key in tags for key in ("cluster", "owner", "expiry", "managed-by"))


def test_outputs_are_what_the_inventory_parser_reads(tmp_path):
    output = _blocks("output")["inventory"]["value"]
    top = set(output)
    node_fields = set(re.findall(r"(\w+)\s*=", output["nodes"].split("{", 1)[1]))
    fixture = OUTPUTS["inventory"]["value"]
    assert top == set(fixture), "outputs.tf and the terraform output fixture disagree"
    assert node_fields == set(fixture["nodes"][0]), "node fields in outputs.tf and the fixture disagree"
    state = ClusterState.for_cluster("gpu", root=tmp_path)
    inventory_from_outputs(OUTPUTS, state, KEYS, "img")
    for field in sorted((top - {"nodes"}) | node_fields - {"public_ip"}):  # every field is read
        broken = json.loads(json.dumps(OUTPUTS))
        value = broken["inventory"]["value"]
        if field in value:
            del value[field]
        else:
            del value["nodes"][0][field]
        with pytest.raises(UserError, match=field):
            inventory_from_outputs(broken, state, KEYS, "img")


def test_checkov_finds_no_unexplained_failures():
    assert CHECKOV.exists(), f"checkov is missing at {CHECKOV}; run 'make setup'"
    result = subprocess.run([str(CHECKOV), "-d", str(INFRA), "--skip-download", "--compact", "--quiet", "-o", "json"],
                            capture_output=True, text=True, timeout=120)
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    terraform = [r for r in reports if r.get("check_type") == "terraform"]
    assert terraform and terraform[0]["summary"]["resource_count"] >= 10, result.stdout[:2000]
    summary = terraform[0]["summary"]
    failed = [(c["check_id"], c["resource"]) for r in reports for c in r["results"].get("failed_checks", [])]
    assert not failed and summary["parsing_errors"] == 0, f"checkov failures: {failed}"
    text = "".join(p.read_text() for p in MODULE.glob("*.tf"))
    for skip in re.findall(r"#checkov:skip=([^\n]*)", text):
        check_id, _, reason = skip.partition(":")
        assert len(reason.strip()) > 20, f"checkov skip {check_id} needs a reason"


GOOD_VARS = {
    "cluster_name": "dev", "cluster_id": "1a2b3c", "region": "us-east-1", "cluster_type": "g4dn", "instance_type": "g4dn.xlarge",
    "nodes": 1, "ssh_cidr": "203.0.113.4/32", "ssh_public_key": "ssh-ed25519 AAAAC3Nza alice",
    "host_keys": [{"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n",
                   "public_key": "ssh-ed25519 AAAAC3Nza dev-node-0"}],
    "owner": "alice", "ttl_hours": 8, "expires_at": "2026-11-22T18:00:00Z",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-cuda:latest",
}


def _variable_errors(tmp_path: Path, overrides: dict) -> str:
    """Evaluate the validation blocks for real: `terraform plan` of variables.tf alone (no provider needed)."""
    work = tmp_path / "vars"
    work.mkdir()
    shutil.copy(MODULE / "variables.tf", work)
    (work / "terraform.tfvars.json").write_text(json.dumps({**GOOD_VARS, **overrides}))
    tf = terraform_binary()
    subprocess.run([tf, f"-chdir={work}", "init", "-input=false", "-no-color"], check=True, capture_output=True)
    result = subprocess.run([tf, f"-chdir={work}", "plan", "-input=false", "-no-color"], capture_output=True, text=True)
    return " ".join((result.stdout + result.stderr).split()) if result.returncode else ""


@pytest.mark.parametrize("overrides, message", [
    ({}, ""),
    ({"nodes": 65, "host_keys": GOOD_VARS["host_keys"] * 65}, "nodes must be a whole number from 1 to 64"),
    ({"nodes": 0, "host_keys": []}, "nodes must be a whole number from 1 to 64"),
    ({"ssh_cidr": "0.0.0.0/0"}, "ssh_cidr must be a CIDR such as 203.0.113.4/32 and not 0.0.0.0/0"),
    ({"ssh_cidr": "my-laptop"}, "ssh_cidr must be a CIDR"),
    ({"cluster_type": "p5"}, "cluster_type must be one of cpu, g4dn, g4ad"),
    ({"instance_type": "c6i.xlarge"}, "instance_type must belong to cluster_type"),
    ({"cluster_type": "cpu", "instance_type": "g4dn.xlarge"}, "instance_type must belong to cluster_type"),
    ({"cluster_type": "cpu", "instance_type": "c6i.2xlarge"}, ""),
    ({"ttl_hours": 73}, "ttl_hours must be a whole number from 1 to 72"),
    ({"nodes": 2}, "host_keys needs exactly one key pair per node"),
    ({"vpc_id": "vpc-0123"}, "vpc_id and subnet_id go together"),
    ({"cluster_id": "dev"}, "cluster_id must be 6 lowercase hex digits"),
    ({"availability_zone": "us-east-1"}, "availability_zone must be a zone name such as us-east-1b"),
    ({"ecr_repository": "Multinode CUDA"}, "ecr_repository must be an ECR repository name"),
    ({"amdgpu_installer_url": "https://repo.radeon.com/amdgpu-install/6.1.3/ubuntu/jammy/amdgpu-install_6.1.60103-1_all.deb"},
     "amdgpu_installer_url must be AMD's amdgpu-install .deb for Ubuntu noble"),
    # any AMD release for noble (no longer only 7.2.x), or none: the kernel's own amdgpu (issue 27 item 3)
    ({"amdgpu_installer_url": "https://repo.radeon.com/amdgpu-install/7.2.4/ubuntu/noble/amdgpu-install_7.2.4.70204-1_all.deb"}, ""),
    ({"amdgpu_installer_url": None}, ""),
    ({"image": None}, ""),  # the host runtime (issue 27 item 10)
    ({"image": "multinode-cuda:latest"}, "image must be a reference with a registry host the nodes can pull from"),
    ({"image": None, "host_requirements": ["numpy>=2"]}, "host_requirements must be pinned requirements"),
    # issue 37 item 4: nodes launched outside the placement group after a capacity refusal; the provider's retries
    ({"outside_placement_group": [0, 1]}, ""),
    ({"outside_placement_group": [-1]}, "outside_placement_group must list node indexes"),
    ({"max_retries": 0}, "max_retries must be a whole number from 1 to 25"),
    ({"max_retries": 3}, ""),
])
def test_validation_rules_accept_good_and_reject_bad_values(tmp_path, overrides, message):
    errors = _variable_errors(tmp_path, overrides)
    if message:
        assert message in errors, errors
    else:
        assert errors == ""
