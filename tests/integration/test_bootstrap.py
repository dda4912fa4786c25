"""The node bootstrap as Terraform renders it for each kind (cpu, g4dn, g4ad) and runtime (an image, or
the host runtime): the real terraform (offline, provider from the local mirror) evaluates
``local.bootstrap_script`` of infra/ec2 (node 0's: each node's carries its own expiry) with the variables
``up`` writes (its own bootstrap_tfvars),
shellcheck checks every rendering, the TTL timer's calendar time is parsed by systemd itself, and the
script's start (error trap, TTL, apt) runs for real here with its system paths moved under a temporary
directory and systemctl/apt-get/sleep/shutdown/modprobe replaced by recording stand-ins on PATH (g4ad's
first boot and the boot after its reboot included). What the rest does on a
real EC2 node is not run here (no AWS); tests/integration/test_bootstrap_runtime.py runs the host runtime
install and the GPU smoke verdict on local nodes.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
from terraform_offline import MODULE, require_terraform, terraform_env

from multinode.core.config import ClusterSpec
from multinode.providers.aws.keys import new_ed25519
from multinode.providers.aws.bootstrap_inputs import bootstrap_tfvars
from multinode.providers.aws.settings import AwsSettings

pytestmark = pytest.mark.integration

EXPIRES = "2026-11-22T18:00:00Z"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-dev-1a2b3c:cuda"


KINDS = [f"{kind}-{runtime}" for kind in ("cpu", "g4dn", "g4ad") for runtime in ("image", "host")]


def render_all(tmp_path_factory) -> dict[str, str]:
    """'<kind>-image' / '<kind>-host' -> the bootstrap script exactly as user data carries it."""
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
    for name in KINDS:
        kind, runtime = name.split("-")
        options = {"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", **({"image": IMAGE} if runtime == "image" else {})}
        spec = ClusterSpec(name="dev", provider="aws", cluster_type=kind, options=options)
        tfvars = {"cluster_name": "dev", "region": "us-east-1", "cluster_type": kind, "nodes": 1,
                  "ssh_cidr": "203.0.113.4/32", "ssh_public_key": public, "owner": "alice",
                  "host_keys": [{"private_key": private, "public_key": public}], "expires_at": EXPIRES,
                  "ami_id": "ami-12c6146b", "cluster_id": "1a2b3c", **bootstrap_tfvars(spec, AwsSettings.from_spec(spec))}
        (work / f"{name}.tfvars.json").write_text(json.dumps(tfvars))
        console = subprocess.run([terraform, f"-chdir={work}", "console", f"-var-file={name}.tfvars.json"],
                                 input="base64encode(local.bootstrap_script[0])\n", capture_output=True, text=True,
                                 env=env, timeout=300)
        assert console.returncode == 0, console.stdout + console.stderr
        scripts[name] = base64.b64decode(console.stdout.strip().strip('"')).decode()
    return scripts


@pytest.fixture(scope="module")
def rendered(bootstrap_renderings, monkeypatch_module) -> dict[str, str]:
    return dict(bootstrap_renderings)  # rendered once per session (conftest.py)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MULTINODE_IMAGE", raising=False)
        yield patch


@pytest.mark.parametrize("kind", KINDS)
def test_every_rendering_passes_shellcheck(rendered, kind):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: apt-get install shellcheck"
    result = subprocess.run([shellcheck, "--shell=bash", "--severity=style", "--format=gcc", "-"],
                            input=rendered[kind], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_every_rendering_goes_through_apt_get_and_ends_with_the_ready_marker(rendered, kind):
    script = rendered[kind]
    apt_lines = [line.strip() for line in script.splitlines() if re.match(r"\s*(if )?apt-get ", line)]
    assert apt_lines == [
        'if apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"; then return 0; fi',
        'apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"  # the 5th: its failure is the bootstrap\'s (ERR trap, this line)']
    assert script.splitlines()[8] == "set -Eeuo pipefail"
    assert (f'image="{IMAGE}"' in script) == kind.endswith("-image") and f"echo \"{EXPIRES}\" >\"$state/expiry\"" in script
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-2:] == ['mv "$state/ready.tmp" "$state/ready"', 'echo "multinode: bootstrap done $(date -u +%FT%TZ)"']
    assert ("linux-modules-extra" in script) == kind.startswith("g4ad")
    assert ("nvidia-smi" in script) == kind.startswith("g4dn")
    assert ("docker pull" in script) == kind.endswith("-image") and ("python3 -m venv" in script) == kind.endswith("-host")
    # The GPU smoke test, the very SMOKE_SCRIPT of multinode.checks.gpu, on GPU nodes only.
    assert ("def report(**kw):" in script) == (not kind.startswith("cpu"))
    assert "%{" not in script and "$${" not in script  # every template directive was evaluated
    # EC2 takes at most 16 KB of user data (raw): the script plus the cloud-config around it (host keys, YAML
    # escapes: 12.7 KB in all for the largest rendering, g4ad-image, measured with compute.tf's expression).
    assert len(script.encode()) <= 13 * 1024


def test_the_g4ad_driver_needs_no_dkms_unless_asked_and_the_host_torch_is_rocm72(rendered):
    script = rendered["g4ad-host"]
    assert "apt_get install linux-firmware linux-modules-extra-aws" in script  # AWS's install-amd-driver page
    assert "amdgpu-install" not in [line.split()[0] for line in script.splitlines() if line.strip()]  # not run
    assert 'pip_install --index-url "https://download.pytorch.org/whl/rocm7.2" "torch==2.13.0+rocm7.2"' in script
    assert "--device /dev/kfd --device /dev/dri --group-add video" in rendered["g4ad-image"]
    assert 'pip_install --index-url "https://pypi.org/simple" "torch==2.13.0"' in rendered["g4dn-host"]
    assert 'pip_install --index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0+cpu"' in rendered["cpu-host"]
    assert "pip_install numpy==2.4.6 mpi4py==4.1.2" in rendered["cpu-host"]


def test_the_ttl_timer_is_a_calendar_time_systemd_accepts(rendered):
    calendar = re.search(r"^OnCalendar=(.+)$", rendered["cpu-image"], re.M).group(1)
    assert calendar == "2026-11-22 18:00:00 UTC"
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (package systemd)"
    result = subprocess.run([analyze, "calendar", calendar], capture_output=True, text=True)
    assert result.returncode == 0 and "Normalized form: 2026-11-22 18:00:00 UTC" in result.stdout, result.stdout
    assert re.search(r"^OnBootSec=", rendered["cpu-image"], re.M)  # checked again after every boot
    assert "systemctl enable --now multinode-ttl.timer" in rendered["cpu-image"]


@pytest.mark.parametrize("expiry, ends", [("2026-11-22T18:00:00Z", True), ("2999-01-01T00:00:00Z", False)])
def test_the_ttl_script_ends_the_instance_only_after_its_expiry(rendered, tmp_path, expiry, ends):
    """The script the timer runs, as rendered, run for real with its expiry file and `shutdown` redirected."""
    script = rendered["cpu-image"].split("<<'TTL'\n", 1)[1].split("\nTTL\n", 1)[0]
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


# --- the start of the script, run for real ------------------------------------------------------

STUBS = {
    # systemctl: records its arguments. While the file active_left counts down, the asked unit is a Type=oneshot
    # unit whose command runs: systemd's ActiveState is "activating" (systemd.service(5), Type=oneshot: "up" only
    # once the command exited), so `show -p ActiveState --value` prints "activating" and `is-active` exits 3, as
    # systemd's own does for any state but active/reloading/refreshing (src/systemctl/systemctl-is-active.c,
    # verb_is_active); then "inactive" (exit 3).
    "systemctl": '#!/bin/bash\necho "systemctl $*" >>"$STUB_LOG"\nif [ "$1" = is-active ] || [ "$1" = show ]; then\n'
                 '  n=$(cat "$STUB_DIR/active_left" 2>/dev/null || echo 0); state=inactive\n'
                 '  if [ "$n" -gt 0 ]; then echo $((n - 1)) >"$STUB_DIR/active_left"; state=activating; fi\n'
                 '  if [ "$1" = show ]; then echo "$state"; exit 0; fi\n  exit 3\nfi\n',
    # apt-get: records its arguments; fails (exit 100, apt's own message) while the file FAILS_LEFT counts down.
    "apt-get": '#!/bin/bash\necho "apt-get $*" >>"$STUB_LOG"\nn=$(cat "$STUB_DIR/fails_left" 2>/dev/null || echo 0)\n'
               'if [ "$n" -gt 0 ]; then echo $((n - 1)) >"$STUB_DIR/fails_left"\n'
               '  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1234 (apt-get)" >&2; exit 100; fi\n',
    "sleep": '#!/bin/bash\necho "sleep $*" >>"$STUB_LOG"\n',  # no waiting in a test; the calls are recorded
    "shutdown": '#!/bin/bash\necho "shutdown $*" >>"$STUB_LOG"\n',
    "modprobe": '#!/bin/bash\necho "modprobe $*" >>"$STUB_LOG"\n',
}


def run_start(script: str, tmp_path, *, fails: int, active: int, until: str = "apt_get update") -> tuple[subprocess.CompletedProcess, dict]:
    """The rendered script up to its first line ``until`` (run, then `echo PAST-<until>`), run with bash: its
    system paths moved under tmp_path, systemctl/apt-get/sleep/shutdown/modprobe the recording stand-ins above. Run
    again with the same tmp_path, it finds the files the first run left (a second boot)."""
    head = script.split(f"\n{until}\n", 1)[0] + f"\n{until}\necho PAST-{until}\n"
    where = {name: tmp_path / name for name in ("state", "units", "sbin", "stubs", "opt")}
    for path in where.values():
        path.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (where["stubs"] / name).write_text(body)
        (where["stubs"] / name).chmod(0o755)
    (where["stubs"] / "fails_left").write_text(str(fails))
    (where["stubs"] / "active_left").write_text(str(active))
    moved = (head.replace("/var/lib/multinode", str(where["state"]))
             .replace("/var/log/multinode-bootstrap.log", str(tmp_path / "bootstrap.log"))
             .replace("/etc/systemd/system", str(where["units"])).replace("/usr/local/sbin", str(where["sbin"]))
             .replace("/opt/multinode", str(where["opt"])).replace("-o ubuntu -g ubuntu ", ""))
    assert "/var/lib/multinode" not in moved and "/etc/systemd" not in moved and "/opt/multinode" not in moved
    (tmp_path / "bootstrap.sh").write_text(moved)
    env = {"PATH": f"{where['stubs']}:/usr/bin:/bin", "STUB_LOG": str(tmp_path / "calls.log"), "STUB_DIR": str(where["stubs"])}
    result = subprocess.run(["bash", str(tmp_path / "bootstrap.sh")], capture_output=True, text=True, env=env, timeout=60)
    return result, where


def test_an_apt_failure_inside_apt_get_writes_the_failed_marker_with_its_line(rendered, tmp_path):
    """Issue 27 item 6: without `set -E`, errexit leaves from inside apt_get with no ERR trap: no marker, and
    `up` waits 40 minutes for a node that died in its first minute."""
    script = rendered["cpu-host"]
    result, where = run_start(script, tmp_path, fails=99, active=0)
    assert result.returncode == 100 and "PAST-" not in (tmp_path / "bootstrap.log").read_text()
    line = next(n for n, text in enumerate(script.splitlines(), 1) if "# the 5th: its failure is the bootstrap's" in text)
    failed = (where["state"] / "failed").read_text()
    assert failed == f'line {line} exit 100: apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"\n'
    log = (tmp_path / "bootstrap.log").read_text()
    assert f"bootstrap FAILED (exit 100) at line {line}" in log and "Could not get lock /var/lib/apt/lists/lock" in log
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert [c for c in calls if c.startswith("apt-get")] == ["apt-get -o DPkg::Lock::Timeout=600 -y -q update"] * 5
    assert [c for c in calls if c.startswith("sleep")] == ["sleep 15", "sleep 30", "sleep 45", "sleep 60"]  # bounded


def test_apt_waits_for_apt_daily_then_retries_the_lists_lock_and_goes_on(rendered, tmp_path):
    """Issue 27 item 2: apt-daily/unattended-upgrades still running at first boot (3 'activating' answers: a running
    oneshot unit, issue 37 item 3), then the lists lock still held once (apt-get update's lock is not covered by
    DPkg::Lock::Timeout)."""
    result, where = run_start(rendered["g4dn-image"], tmp_path, fails=1, active=3)
    assert result.returncode == 0, (tmp_path / "bootstrap.log").read_text()
    log = (tmp_path / "bootstrap.log").read_text()
    assert log.rstrip().endswith("PAST-apt_get update") and not (where["state"] / "failed").exists()
    assert log.count("waiting for apt-daily.service / unattended-upgrade to finish") == 3
    assert "apt-get update failed (attempt 1 of 5); retrying in 15 s" in log
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls.index("systemctl stop apt-daily.timer apt-daily-upgrade.timer") < calls.index(
        "apt-get -o DPkg::Lock::Timeout=600 -y -q update")
    # apt ran only once apt-daily.service was no longer activating/active
    first_apt = calls.index("apt-get -o DPkg::Lock::Timeout=600 -y -q update")
    assert calls[:first_apt].count("systemctl show -p ActiveState --value apt-daily.service") == 4
    assert [c for c in calls if c.startswith("apt-get")] == ["apt-get -o DPkg::Lock::Timeout=600 -y -q update"] * 2


def test_g4ad_first_boot_installs_the_kernel_driver_reboots_once_and_the_second_boot_goes_on(rendered, tmp_path):
    """Issue 27 item 3: AWS's g4ad steps for Ubuntu 24.04 (firmware + the kernel's extra modules, a reboot);
    the reboot is scheduled and the script exits 0, so cloud-init ends its run; the resume unit runs it again."""
    script = rendered["g4ad-host"]
    first, where = run_start(script, tmp_path, fails=0, active=0, until="modprobe amdgpu")
    assert first.returncode == 0, (tmp_path / "bootstrap.log").read_text()
    log = (tmp_path / "bootstrap.log").read_text()
    assert "PAST-modprobe amdgpu" not in log and "rebooting once (AWS's g4ad procedure)" in log
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert "apt-get -o DPkg::Lock::Timeout=600 -y -q install linux-firmware linux-modules-extra-aws" in calls
    assert calls[-2:] == ["systemctl enable multinode-bootstrap.service",
                          "shutdown -r +1 multinode: reboot for the amdgpu driver"]
    assert (where["state"] / "resume").exists() and (where["state"] / "driver-rebooted").exists()
    unit = (where["units"] / "multinode-bootstrap.service").read_text()
    assert f"ConditionPathExists={where['state']}/resume" in unit and not (where["state"] / "failed").exists()

    (tmp_path / "calls.log").unlink()
    second, _ = run_start(script, tmp_path, fails=0, active=0, until="modprobe amdgpu")  # the boot after
    assert second.returncode == 0, (tmp_path / "bootstrap.log").read_text()
    assert (tmp_path / "bootstrap.log").read_text().rstrip().endswith("PAST-modprobe amdgpu")
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert not any(c.startswith("shutdown") for c in calls) and "systemctl disable multinode-bootstrap.service" in calls
    assert calls[-1] == "modprobe amdgpu"  # the kernel's own amdgpu; no amdgpu-install unless asked for
    assert not any("linux-firmware" in c for c in calls) and not (where["state"] / "resume").exists()


def test_the_ready_marker_records_torch_nccl_and_the_libmpi_mpi4py_loaded(rendered, tmp_path):
    """Issue 37 item 6: the marker's version lines, made by the rendered versions.py run for real with this
    machine's torch (a CPU build: no CUDA, no NCCL) and mpi4py, and the line `make status` makes of them."""
    import sys

    from multinode.providers.aws.readiness import software_summary

    for kind in ("cpu-host", "g4dn-image"):
        assert "versions.py" in rendered[kind]
    script = rendered["g4dn-image"].split("<<'VERSIONS'\n", 1)[1].split("\nVERSIONS\n", 1)[0]
    (tmp_path / "versions.py").write_text(script)
    result = subprocess.run([sys.executable, str(tmp_path / "versions.py")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    import mpi4py
    import torch
    fields = dict(line.split("=", 1) for line in result.stdout.splitlines())
    assert fields["torch"] == torch.__version__ and fields["cuda"] == str(torch.version.cuda)
    assert fields["nccl"] == "None" and fields["mpi4py"] == mpi4py.__version__
    assert re.match(r"(Open MPI|MPICH|Intel\(R\) MPI) ", fields["libmpi"]) and "\x00" not in fields["libmpi"]
    marker = f"image=\ngpus=0\nruntime=host /opt/multinode/venv/bin/python\n{result.stdout}"
    assert software_summary(marker) == f"torch {torch.__version__}; libmpi: {fields['libmpi']}; mpi4py {mpi4py.__version__}"
