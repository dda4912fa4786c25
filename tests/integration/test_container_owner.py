"""Who owns what a job writes in containers (issue 27, item 1), on local nodes logged into as a non-root user.

A cloud node's SSH user is ``ubuntu``, and Docker runs a container as the image's root unless told otherwise:
Python's ``__pycache__``, the snapshots and the SETUP environment in the mounted work directory then belong to
root, and the user's next sync or ``rm -rf`` there fails. As root here, the local nodes hid that. This file
makes a system user for the test, brings up a 2-node cluster logged into as that user (``-o ssh_user``), whose
container CLI is podman as root through ``sudo`` (what Docker's socket gives ``ubuntu``), runs jobs in the CPU
image (built by ``make image`` like tests/integration/test_images.py), and asserts that every file in every
node's work directory belongs to the user, that the user can delete all of it, and that a second run works.
``--passwd=false`` keeps podman from adding a passwd entry for the uid, as Docker does not: MODE=mpi then
proves the image serves one itself (ssh refuses a uid without one).
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from localcluster import bring_up, tear_down
from test_images import RUN_ARGS, built_cpu_image

pytestmark = pytest.mark.integration

SHORT = "--args=--workload digits --steps-per-epoch 5 2 1"  # 2 epochs of 5 steps, a snapshot after each: no accuracy asserted, files written


@pytest.fixture(scope="module")
def job_user():
    """A system user of this machine with podman (only) as root through sudo; removed afterwards."""
    for tool in ("useradd", "userdel", "sudo", "visudo"):
        assert shutil.which(tool), f"{tool} is missing: run 'make setup'"
    name = f"mnu{uuid.uuid4().hex[:6]}"
    base = Path(tempfile.mkdtemp(prefix="mn-owner-", dir="/var/tmp"))
    base.chmod(0o755)  # the user reads the cluster's public key and its work directories below
    subprocess.run(["useradd", "--create-home", "--home-dir", str(base / "home"), "--shell", "/bin/sh",
                    "--user-group", name], check=True)
    # useradd leaves the password locked ("!"), and sshd without PAM refuses a locked account even for a key.
    subprocess.run(["usermod", "--password", "*", name], check=True)
    sudoers = Path(f"/etc/sudoers.d/{name}")
    # SETENV: the container CLI passes the job's variables by name (-e NAME), from sudo's environment (-E).
    sudoers.write_text(f"{name} ALL=(root) NOPASSWD:SETENV: {shutil.which('podman')}\n")
    sudoers.chmod(0o440)
    try:
        subprocess.run(["visudo", "-cf", str(sudoers)], check=True, capture_output=True)
        yield name, base
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def cpu_image():
    return built_cpu_image()


@pytest.fixture(scope="module")
def user_cluster(job_user, cpu_image):
    name, base = job_user
    store, tag = cpu_image
    cluster = bring_up(base / "mnhome", 2, prefix="own", options={
        "runtime": "docker", "image": tag, "ssh_user": name,
        "container_cli": shlex.join(["sudo", "-n", "-E", *store.podman]),
        "container_args": f"{RUN_ARGS} --passwd=false",
    })
    try:
        yield cluster
    finally:
        tear_down(cluster)


def not_the_users(cluster, user: str) -> list[str]:
    """Every path in the nodes' work directories that the SSH user does not own."""
    uid = pwd.getpwnam(user).pw_uid
    found = []
    for node in cluster.inventory().nodes:
        root = Path(cluster.inventory().workdir_for(node.name))
        for path in [root, *root.rglob("*")]:
            if path.lstat().st_uid != uid:
                found.append(f"{path.relative_to(root.parent)} (uid {path.lstat().st_uid})")
    return found


@pytest.mark.parametrize("mode", ["cpu", "mpi"])
def test_everything_a_container_job_writes_is_the_ssh_users(job_user, user_cluster, mode):
    user, _ = job_user
    assert {n.ssh_user for n in user_cluster.inventory().nodes} == {user}
    for attempt in (1, 2):  # the second run syncs over the first one's files
        res = user_cluster.cli("train", "--nodes", "2", "--mode", mode, "--launcher", "static" if mode == "cpu" else "auto",
                               SHORT, timeout=600)
        assert res.returncode == 0, f"run {attempt}: " + res.stdout[-3000:] + res.stderr[-3000:]
        summary = json.loads((user_cluster.runs()[-1] / "summary.json").read_text())
        assert summary["result"]["world_size"] == 2 and set(summary["exit_codes"].values()) == {0}, summary
        wrong = not_the_users(user_cluster, user)
        assert not wrong, f"{len(wrong)} paths not owned by {user}: {wrong[:10]}"
    # Python wrote its byte code, and the trainer its snapshots, inside the containers: as the user.
    workdir = Path(user_cluster.inventory().workdir_for("node-0"))
    assert list(workdir.glob("code/training/**/__pycache__/*.pyc")), "no byte code written: nothing was tested"
    assert user_cluster.job_processes() == {"node-0": [], "node-1": []}


def test_the_ssh_user_can_delete_the_whole_work_directory(job_user, user_cluster):
    """What a redeploy or a user's cleanup does on a node: everything under the work directory goes, as the user."""
    user, _ = job_user
    res = user_cluster.cli("train", "--nodes", "2", "--mode", "cpu", "--launcher", "static", SHORT, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for node in user_cluster.inventory().nodes:
        workdir = user_cluster.inventory().workdir_for(node.name)
        res = subprocess.run(["runuser", "-u", user, "--", "find", workdir, "-mindepth", "1", "-delete"],
                             capture_output=True, text=True)
        assert res.returncode == 0 and res.stderr == "", res.stderr[-2000:]
        assert os.listdir(workdir) == []
