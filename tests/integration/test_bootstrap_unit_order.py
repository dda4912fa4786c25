"""Issue 37 item 1: g4ad's resume unit (``multinode-bootstrap.service``, infra/ec2/user_data.sh.tftpl) must not be in
an ordering cycle with cloud-init on Ubuntu, or systemd drops a job at the boot after the driver's reboot and the
bootstrap never finishes (`up` waits its 2,400 s, then destroys the cluster).

The real ``systemd-analyze verify`` (systemd 252 here) loads a unit tree made of cloud-init's own units as Ubuntu 24.04's
package installs them (tests/integration/cloudinit_units/, rendered from cloud-init's templates: see its README),
enabled as ``systemctl enable`` and cloud-init's generator would (``<target>.wants/`` links), our unit exactly as the
template writes it, and this machine's systemd units for the rest (multi-user.target, network-online.target...).
Verifying ``multi-user.target`` builds its start transaction, and systemd reports an ordering cycle in it as
"Found ordering cycle on ..." (the exit status stays 0, so the test reads the messages). The first test shows the
check sees the cycle the cloud-init maintainer reproduced (canonical/cloud-init PR 5830, 2025-07-07) and the unit
this bootstrap had before issue 37; the second, that today's unit has none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (ROOT / "infra" / "ec2" / "user_data.sh.tftpl").read_text()
CLOUD_INIT_UNITS = Path(__file__).resolve().parent / "cloudinit_units"
UNIT = "multinode-bootstrap.service"

# The unit holmanb posted as "cycle" in canonical/cloud-init PR 5830 (comment of 2025-07-07).
PR_5830_CYCLE = """[Unit]
Description=my service
After=cloud-final.service

[Service]
Type=oneshot
ExecStart=sh -c 'echo "hi world"'

[Install]
WantedBy=multi-user.target
"""
# This bootstrap's unit before issue 37 (git show c415af5:infra/ec2/user_data.sh.tftpl).
BEFORE_ISSUE_37 = """[Unit]
Description=multinode: the bootstrap after its reboot
ConditionPathExists=/var/lib/multinode/resume
Wants=network-online.target
After=network-online.target cloud-final.service

[Service]
Type=oneshot
ExecStart=/var/lib/multinode/bootstrap.sh

[Install]
WantedBy=multi-user.target
"""


def our_unit() -> str:
    """The unit exactly as the bootstrap writes it (no template directive inside)."""
    body = TEMPLATE.split(f"cat >/etc/systemd/system/{UNIT} <<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0] + "\n"
    assert "${" not in body and "%{" not in body
    return body


def unit_tree(tmp_path: Path, unit_text: str) -> Path:
    """cloud-init's Ubuntu units + ``unit_text`` as multinode-bootstrap.service, each enabled by its [Install]."""
    tree = tmp_path / "units"
    shutil.copytree(CLOUD_INIT_UNITS, tree, ignore=shutil.ignore_patterns("*.md"))
    (tree / UNIT).write_text(unit_text)
    for unit in sorted(p for p in tree.iterdir() if p.is_file()):
        for target in re.findall(r"^WantedBy=(.+)$", unit.read_text(), re.M):
            for name in target.split():
                wants = tree / f"{name}.wants"
                wants.mkdir(exist_ok=True)
                (wants / unit.name).symlink_to(f"../{unit.name}")
    # cloud-init-generator (systemd/cloud-init-generator.tmpl): multi-user.target.wants/cloud-init.target
    wants = tree / "multi-user.target.wants"
    wants.mkdir(exist_ok=True)
    (wants / "cloud-init.target").symlink_to("../cloud-init.target")
    return tree


def ordering_cycles(tmp_path: Path, unit_text: str) -> tuple[list[str], str]:
    """What `systemd-analyze verify multi-user.target` over the tree said of ordering cycles ("Found ordering cycle
    on X", "Found dependency on Y", ..., "Job Z deleted to break ordering cycle"), and all it said."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (package systemd)"
    tree = unit_tree(tmp_path, unit_text)
    # SYSTEMD_UNIT_PATH ending in ':' puts the tree first and keeps the built-in search path after it (systemd.unit(5)).
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tree}:", "SYSTEMD_LOG_COLOR": "0"}
    result = subprocess.run([analyze, "verify", "multi-user.target", str(tree / UNIT)], capture_output=True,
                            text=True, env=env, timeout=120)
    said = result.stdout + result.stderr
    return [line for line in said.splitlines() if re.search(r"ordering cycle|Found dependency on|cyclic", line)], said


@pytest.mark.parametrize("unit_text", [PR_5830_CYCLE, BEFORE_ISSUE_37], ids=["pr-5830-example", "before-issue-37"])
def test_the_check_sees_the_cycle_of_a_unit_after_cloud_final_wanted_by_multi_user(tmp_path, unit_text):
    cycles, said = ordering_cycles(tmp_path, unit_text)
    assert cycles, said
    assert any("cloud-final.service" in line for line in cycles) and any(UNIT in line for line in cycles), said


def test_the_resume_unit_is_in_no_ordering_cycle_with_ubuntus_cloud_init(tmp_path):
    unit = our_unit()
    cycles, said = ordering_cycles(tmp_path, unit)
    assert cycles == [], said
    assert "WantedBy=multi-user.target" in unit  # still started at every boot (when the resume file is there)
    assert re.search(r"^After=.*\bcloud-init\.target\b", unit, re.M)  # and after cloud-init's own run
