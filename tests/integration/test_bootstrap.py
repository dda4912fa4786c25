"""The node bootstrap as Terraform renders it for each kind (cpu, g4dn, g4ad): the real terraform
(offline, provider from the local mirror) evaluates ``local.bootstrap_script`` of infra/ec2 with the
variables ``up`` writes, shellcheck checks every rendering, and the TTL timer's calendar time is
parsed by systemd itself. What the script does on a real EC2 node is not run here (no AWS).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
from terraform_offline import MODULE, require_terraform, terraform_env

from multinode.providers.aws.keys import new_ed25519

pytestmark = pytest.mark.integration

EXPIRES = "2026-11-22T18:00:00Z"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-dev-1a2b3c:cuda"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    """kind -> the bootstrap script exactly as user data carries it."""
    terraform = require_terraform()
    tmp = tmp_path_factory.mktemp("bootstrap")
    work = tmp / "ec2"
    shutil.copytree(MODULE, work)
    env = {**terraform_env(tmp), "PATH": "/usr/bin:/bin:/usr/local/bin", "AWS_EC2_METADATA_DISABLED": "true"}
    init = subprocess.run([terraform, f"-chdir={work}", "init", "-input=false", "-no-color", "-lockfile=readonly"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert init.returncode == 0, init.stdout + init.stderr
    private, public = new_ed25519("dev-node-0")
    scripts = {}
    for kind in ("cpu", "g4dn", "g4ad"):
        tfvars = {"cluster_name": "dev", "region": "us-east-1", "cluster_type": kind, "nodes": 1,
                  "ssh_cidr": "203.0.113.4/32", "ssh_public_key": public, "owner": "alice",
                  "host_keys": [{"private_key": private, "public_key": public}], "expires_at": EXPIRES,
                  "image": IMAGE, "ami_id": "ami-12c6146b", "cluster_id": "1a2b3c"}
        (work / f"{kind}.tfvars.json").write_text(json.dumps(tfvars))
        console = subprocess.run([terraform, f"-chdir={work}", "console", f"-var-file={kind}.tfvars.json"],
                                 input="base64encode(local.bootstrap_script)\n", capture_output=True, text=True,
                                 env=env, timeout=300)
        assert console.returncode == 0, console.stdout + console.stderr
        scripts[kind] = base64.b64decode(console.stdout.strip().strip('"')).decode()
    return scripts


@pytest.mark.parametrize("kind", ["cpu", "g4dn", "g4ad"])
def test_every_rendering_passes_shellcheck(rendered, kind):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: apt-get install shellcheck"
    result = subprocess.run([shellcheck, "--shell=bash", "--severity=style", "--format=gcc", "-"],
                            input=rendered[kind], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("kind", ["cpu", "g4dn", "g4ad"])
def test_every_rendering_waits_for_dpkg_and_ends_with_the_ready_marker(rendered, kind):
    script = rendered[kind]
    apt_lines = [line for line in script.splitlines() if re.search(r"\bapt-get\b", line)]
    assert apt_lines == ['apt_get() { apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"; }']  # every call goes through it
    assert f'image="{IMAGE}"' in script and f"echo \"{EXPIRES}\" >\"$state/expiry\"" in script
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-2:] == ['mv "$state/ready.tmp" "$state/ready"', 'echo "multinode: bootstrap done $(date -u +%FT%TZ)"']
    assert ("amdgpu-install" in script) == (kind == "g4ad")
    assert ("nvidia-smi" in script) == (kind == "g4dn")
    assert "%{" not in script and "$${" not in script  # every template directive was evaluated


def test_the_g4ad_driver_is_rocm_72_for_noble_with_kernel_headers(rendered):
    script = rendered["g4ad"]
    assert "https://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/noble/amdgpu-install_7.2.1.70201-1_all.deb" in script
    assert "(ROCm 7.2.1)" in script
    assert 'apt_get install "linux-headers-$(uname -r)"' in script and "apt_get install amdgpu-dkms" in script


def test_the_ttl_timer_is_a_calendar_time_systemd_accepts(rendered):
    calendar = re.search(r"^OnCalendar=(.+)$", rendered["cpu"], re.M).group(1)
    assert calendar == "2026-11-22 18:00:00 UTC"
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (package systemd)"
    result = subprocess.run([analyze, "calendar", calendar], capture_output=True, text=True)
    assert result.returncode == 0 and "Normalized form: 2026-11-22 18:00:00 UTC" in result.stdout, result.stdout
    assert re.search(r"^OnBootSec=", rendered["cpu"], re.M)  # checked again after every boot
    assert "systemctl enable --now multinode-ttl.timer" in rendered["cpu"]


@pytest.mark.parametrize("expiry, ends", [("2026-11-22T18:00:00Z", True), ("2999-01-01T00:00:00Z", False)])
def test_the_ttl_script_ends_the_instance_only_after_its_expiry(rendered, tmp_path, expiry, ends):
    """The script the timer runs, as rendered, run for real with its expiry file and `shutdown` redirected."""
    script = rendered["cpu"].split("<<'TTL'\n", 1)[1].split("\nTTL\n", 1)[0]
    expiry_file, called = tmp_path / "expiry", tmp_path / "shutdown.args"
    expiry_file.write_text(expiry + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "shutdown").write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    (bin_dir / "shutdown").chmod(0o755)
    ttl = tmp_path / "multinode-ttl"
    ttl.write_text(script.replace("/var/lib/multinode/expiry", str(expiry_file)))
    result = subprocess.run(["bash", str(ttl)], capture_output=True, text=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert called.exists() == ends
    if ends:
        assert called.read_text().startswith("-h now") and f"expiry {expiry} reached" in result.stdout
