"""infra/ec2/user_data.sh.tftpl as text (no Terraform here; tests/integration/test_bootstrap.py renders
it for real and runs shellcheck): dpkg lock wait, the g4ad driver of the image's ROCm release, the TTL
timer that survives reboots, the ready marker last."""

from __future__ import annotations

import re
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "infra" / "ec2"
TEMPLATE = (MODULE / "user_data.sh.tftpl").read_text()
BOOTSTRAP_TF = (MODULE / "bootstrap.tf").read_text()
VARIABLES_TF = (MODULE / "variables.tf").read_text()


def _commands() -> list[str]:
    return [line.strip() for line in TEMPLATE.splitlines() if line.strip() and not line.lstrip().startswith(("#", "%{"))]


def test_every_apt_call_waits_for_the_dpkg_lock():
    apt = [line for line in _commands() if re.search(r"(^|[;&|{]\s*)apt(-get|_get)?\s", line)]
    assert apt[0] == 'apt_get() { apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"; }'
    assert all(line.startswith("apt_get ") for line in apt[1:]) and len(apt) > 5  # nothing calls apt-get directly


def test_the_g4ad_driver_is_the_release_of_the_image_rocm():
    release = re.search(r'rocm_release\s*=\s*"([0-9.]+)"', BOOTSTRAP_TF).group(1)
    url = re.search(r'variable "amdgpu_installer_url".*?default\s*=\s*"([^"]+)"', VARIABLES_TF, re.S).group(1)
    found = re.fullmatch(r"https://repo\.radeon\.com/amdgpu-install/([0-9.]+)/ubuntu/noble/amdgpu-install_([0-9.]+)\.(\d{5})-1_all\.deb", url)
    assert found, url
    directory, version, build = found.groups()
    # ROCm 7.2.1 (build 70201), Ubuntu 24.04 (noble): the release the image's ROCm user space pins.
    assert directory == version == release == "7.2.1" and build == "70201"
    g4ad = TEMPLATE.split('%{ if cluster_type == "g4ad" ~}')[1].split("%{ endif ~}")[0]
    assert 'apt_get install "linux-headers-$(uname -r)"' in g4ad  # DKMS builds against the running kernel
    assert "apt_get install amdgpu-dkms" in g4ad and "modprobe amdgpu" in g4ad


def test_the_amis_are_ubuntu_2404():
    main = (MODULE / "main.tf").read_text()
    params = dict(re.findall(r'^\s+(cpu|g4dn|g4ad)\s*=\s*"(/aws/service/[^"]+)"', main, re.M))
    assert params["g4dn"] == "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    assert params["cpu"] == params["g4ad"] == "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"


def test_the_ttl_is_a_timer_rearmed_at_every_boot_not_a_one_shot_shutdown():
    commands = _commands()
    assert not any(line.startswith("shutdown -h +") for line in commands)
    timer = TEMPLATE.split("multinode-ttl.timer <<'UNIT'")[1].split("UNIT\n")[0]
    assert "OnCalendar=${expiry_calendar}" in timer and "OnBootSec=" in timer and "WantedBy=timers.target" in timer
    assert "systemctl enable --now multinode-ttl.timer" in commands
    ttl = TEMPLATE.split("<<'TTL'")[1].split("TTL\n")[0]
    assert "/var/lib/multinode/expiry" in ttl and "shutdown -h now" in ttl
    # The TTL is armed before anything that can fail.
    assert TEMPLATE.index("enable --now multinode-ttl.timer") < TEMPLATE.index("apt_get update")


def test_the_ready_marker_is_written_last_and_failures_leave_a_failed_marker():
    commands = _commands()
    assert commands[-2:] == ['mv "$state/ready.tmp" "$state/ready"', 'echo "multinode: bootstrap done $(date -u +%FT%TZ)"']
    assert TEMPLATE.index("docker pull") < TEMPLATE.index("gpus=0") < TEMPLATE.index('"$state/ready.tmp"')
    assert "trap 'on_error $? $LINENO \"$BASH_COMMAND\"' ERR" in commands
    assert 'exec >>"$log" 2>&1' in commands and "log=/var/log/multinode-bootstrap.log" in commands


def test_the_driver_release_is_the_rocm_of_the_image():
    """The g4ad host's amdgpu driver and the ROCm image move together: one release, in both places."""
    dockerfile = (MODULE.parents[1] / "docker" / "rocm" / "Dockerfile").read_text()
    image = re.search(r"^ARG ROCM_VERSION=(\S+)$", dockerfile, re.M).group(1)
    assert re.search(r'rocm_release\s*=\s*"([0-9.]+)"', BOOTSTRAP_TF).group(1) == image
