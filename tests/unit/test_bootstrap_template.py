"""infra/ec2/user_data.sh.tftpl as text (no Terraform here; tests/integration/test_bootstrap.py renders
it for real, runs shellcheck, and runs parts of it): errtrace, apt behind apt-daily/unattended-upgrades,
the g4ad driver path AWS documents, the host runtime, the GPU smoke test, the TTL timer that survives
reboots, the ready marker last."""

from __future__ import annotations

import re
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "infra" / "ec2"
TEMPLATE = (MODULE / "user_data.sh.tftpl").read_text()
BOOTSTRAP_TF = (MODULE / "bootstrap.tf").read_text()
VARIABLES_TF = (MODULE / "variables.tf").read_text()


def _commands() -> list[str]:
    return [line.strip() for line in TEMPLATE.splitlines() if line.strip() and not line.lstrip().startswith(("#", "%{"))]


def test_errtrace_so_the_err_trap_fires_inside_functions():
    assert _commands()[0] == "set -Eeuo pipefail"


def test_every_apt_call_waits_for_apt_jobs_and_retries_within_a_bound():
    wrapper = 'apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"'
    apt = [line for line in _commands() if re.search(r"(^|[;&|{]\s*)apt(-get|_get)?\s", line) and wrapper not in line]
    assert all(line.startswith("apt_get ") for line in apt) and len(apt) > 5  # nothing else calls apt-get
    body = TEMPLATE.split("apt_get() {")[1].split("\n}\n")[0]
    assert "for attempt in 1 2 3 4; do" in body and body.count("wait_for_apt_jobs") == 2
    assert body.count("apt-get -o DPkg::Lock::Timeout=600 -y -q \"$@\"") == 2  # 4 tries in an if, then the 5th bare
    waits = TEMPLATE.split("wait_for_apt_jobs() {")[1].split("\n}\n")[0]
    assert "apt-daily.service apt-daily-upgrade.service" in waits and "pgrep -f /usr/bin/unattended-upgrade" in waits
    # A running oneshot unit is "activating", which `is-active` calls inactive: ActiveState is asked (issue 37).
    assert 'apt_unit_busy "$unit"' in waits and not any("is-active" in line for line in _commands())
    busy = TEMPLATE.split("apt_unit_busy() {")[1].split("\n}\n")[0]
    assert 'systemctl show -p ActiveState --value "$1"' in busy and "activating|deactivating|active|reloading) return 0" in busy
    assert '[ "$waited" -ge 1200 ]' in waits  # bounded
    assert "systemctl stop apt-daily.timer apt-daily-upgrade.timer || true" in _commands()
    assert "pkgAcquire::GetLock" in TEMPLATE and "debSystem::Lock" in TEMPLATE  # the sources of the why


def test_the_g4ad_driver_is_the_kernel_amdgpu_as_aws_documents_with_one_reboot():
    g4ad = TEMPLATE.split('%{ if cluster_type == "g4ad" ~}')[1].split("%{ endif ~}\n%{ endif ~}")[0]
    # AWS's page installs linux-modules-extra-aws: the newest AWS kernel's modules, the kernel the reboot boots.
    assert "apt_get install linux-firmware linux-modules-extra-aws" in g4ad and "modules-extra-$(uname" not in g4ad
    assert "install-amd-driver.html" in g4ad and "Our choice, not AWS's" in g4ad
    assert 'shutdown -r +1' in g4ad and "systemctl enable multinode-bootstrap.service" in g4ad
    assert g4ad.index('touch "$state/driver-rebooted" "$state/resume"') < g4ad.index("shutdown -r +1")
    assert "legacy-rocm-build issue 6193" in g4ad
    # AMD's DKMS driver only when asked for, and then with the headers it builds against.
    dkms = g4ad.split('%{ if amdgpu_installer_url != "" ~}')[1]
    assert 'apt_get install "linux-headers-$(uname -r)" wget' in dkms and "amdgpu-install -y --usecase=dkms" in dkms
    assert "modprobe amdgpu" in g4ad
    resume = TEMPLATE.split("multinode-bootstrap.service <<'UNIT'")[1].split("UNIT\n")[0]
    assert "ConditionPathExists=/var/lib/multinode/resume" in resume and "ExecStart=/var/lib/multinode/bootstrap.sh" in resume
    assert 'rm -f "$state/ready" "$state/failed" "$state/resume"' in _commands()


def test_the_installer_url_accepts_any_amd_release_for_noble_or_null():
    block = VARIABLES_TF.split('variable "amdgpu_installer_url"')[1].split("\n}\n")[0]
    assert "default     = null" in block
    pattern = re.search(r'regex\("(.+?)", coalesce', block).group(1).replace("\\\\", "\\")
    for good in ("https://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/noble/amdgpu-install_7.2.1.70201-1_all.deb",
                 "https://repo.radeon.com/amdgpu-install/6.4.1/ubuntu/noble/amdgpu-install_6.4.60401-1_all.deb",
                 "https://repo.radeon.com/amdgpu-install/7.2.4/ubuntu/noble/amdgpu-install_7.2.4.70204-1_all.deb"):
        assert re.fullmatch(pattern, good), good
    for bad in ("https://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/jammy/amdgpu-install_7.2.1.70201-1_all.deb",
                "http://repo.radeon.com/amdgpu-install/7.2.1/ubuntu/noble/amdgpu-install_7.2.1.70201-1_all.deb",
                "https://example.com/amdgpu-install_7.2.1.70201-1_all.deb"):
        assert not re.fullmatch(pattern, bad), bad


def test_without_an_image_the_host_runtime_installs_the_pinned_torch_of_the_kind():
    host = TEMPLATE.split("%{ else ~}\n# --- the host runtime")[1].split("%{ endif ~}")[0]
    assert "apt_get install python3-venv openmpi-bin libopenmpi-dev" in host
    assert 'pip_install --index-url "${torch_index}" "${torch_requirement}"' in host
    assert "pip_install ${host_requirements}" in host
    found = re.findall(r'(cpu|g4dn|g4ad)\s+= \{ index = "([^"]+)", requirement = "([^"]+)" \}', BOOTSTRAP_TF)
    pins = {kind: (index, requirement) for kind, index, requirement in found}
    assert pins == {"cpu": ("https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"),
                    "g4dn": ("https://pypi.org/simple", "torch==2.13.0"),
                    "g4ad": ("https://download.pytorch.org/whl/rocm7.2", "torch==2.13.0+rocm7.2")}
    # the images' release (docker/*/Dockerfile) and the ROCm of PyTorch 2.13's wheels
    dockerfile = (MODULE.parents[1] / "docker" / "rocm" / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_VERSION=2\.13\.0$", dockerfile, re.M) and "ARG TORCH_ROCM=rocm7.2" in dockerfile


def test_the_gpu_smoke_test_ends_the_bootstrap_of_gpu_nodes_in_the_job_runtime():
    smoke = TEMPLATE.split('%{ if cluster_type != "cpu" && gpu_smoke_script != "" ~}')[1].split("\n%{ endif ~}\n\n")[0]
    assert "${gpu_smoke_script}" in smoke and "<<'SMOKE'" in smoke
    assert '${container_gpu_args} -v "$state/gpu_smoke.py:/tmp/gpu_smoke.py:ro"' in smoke  # in the image
    assert '"$venv/bin/python" "$state/gpu_smoke.py" "$gpus"' in smoke  # or in the host runtime
    assert '[ "$verdict" = ok ] || fail_with "$verdict"' in smoke
    assert TEMPLATE.index("gpu_smoke.py") < TEMPLATE.index('"$state/ready.tmp"')


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
    # What ran is recorded: the runtime, and for the host runtime torch, its CUDA/HIP, mpi4py and mpirun.
    assert "printf 'image=%s\\ngpus=%s\\nruntime=%s\\n' \"$image\" \"$gpus\" \"$runtime\"" in commands
    assert "mpi4py={mpi4py.__version__}" in TEMPLATE and "printf 'mpirun=%s\\n'" in TEMPLATE
    # ... and for both runtimes torch's CUDA/HIP and NCCL and the libmpi mpi4py loads (issue 37 item 6).
    marker = TEMPLATE.split('} >"$state/ready.tmp"')[0].rsplit("{\n", 1)[1]
    assert '"$venv/bin/python" "$state/versions.py"' in marker and "/tmp/versions.py" in marker
