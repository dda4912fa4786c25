"""The docker runtime's rendering (container CLI with global options, per-accelerator flags, stop
and pre-flight lines) and the cgroup remounts a local node needs to run containers."""

from __future__ import annotations

import dataclasses
import shlex

from multinode.core.config import LaunchSpec
from conftest import plan_job
from multinode.providers.local.cgroups import cgroup_mount_commands
from multinode.plan.runtime import mpi_sshd_shell, runtime_for, to_shell

PODMAN = "podman --root /cache/storage --storage-driver overlay --runtime runc"


def with_cli(inv, cli: str, args: list[str]):
    return dataclasses.replace(inv, extra={**inv.extra, "container_cli": cli, "container_args": args})


def test_container_cli_keeps_its_global_options_and_args_follow_run(make_inv):
    inv = with_cli(make_inv(2, runtime="docker", image="localhost/multinode-cpu:t"), PODMAN, ["--pull=never"])
    plan, _ = plan_job(inv, LaunchSpec(mode="cpu", nodes=2, run_id="r1", launcher="torchrun"))
    line = to_shell(plan.commands[0], inv, "r1")
    argv = shlex.split(line.split("exec ", 1)[1])
    assert argv[:9] == [*shlex.split(PODMAN), "run", "--rm"]
    assert argv[argv.index("--name") + 1] == "mn-r1-node-0"
    assert "--pull=never" in argv and "--network=host" in argv and "--ipc=host" in argv
    # CPU nodes keep the engine's memlock limit; the image name is followed by the planned argv.
    assert "memlock=-1" not in argv
    image_at = argv.index("localhost/multinode-cpu:t")
    assert argv[image_at + 1:image_at + 3] == ["python3", "-m"]
    assert runtime_for(inv, "r1").stop_line("node-1") == (
        f"{PODMAN} rm -f mn-r1-node-1 >/dev/null 2>&1; {PODMAN} rm -f mn-r1-node-1-sshd >/dev/null 2>&1; true")
    (label, check), = runtime_for(inv).checks()
    assert label == "podman and image localhost/multinode-cpu:t"
    assert check == f"{PODMAN} image inspect localhost/multinode-cpu:t >/dev/null"


def test_gpu_nodes_lift_memlock(make_inv):
    for accelerator in ("nvidia", "amd"):
        inv = make_inv(2, runtime="docker", accelerator=accelerator, image="img:1")
        plan, _ = plan_job(inv, LaunchSpec(mode="gpu", nodes=2, run_id="r2"))
        assert "--ulimit memlock=-1" in to_shell(plan.commands[0], inv, "r2")


def test_host_runtime_has_no_container_stop(make_inv):
    assert runtime_for(make_inv(2), "r1").stop_line("node-0") is None


MOUNTS_V1 = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime,nsdelegate 0 0
tmpfs /run tmpfs rw,nosuid,nodev,mode=755 0 0
"""


def test_cgroup_remounts_repeat_the_hosts_hierarchies_in_order():
    assert cgroup_mount_commands(MOUNTS_V1) == [
        "mkdir -p /sys/fs/cgroup && mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup",
        "mkdir -p /sys/fs/cgroup/cpu,cpuacct && mount -t cgroup -o cpu,cpuacct cgroup /sys/fs/cgroup/cpu,cpuacct",
        "mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd",
        "mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup/unified",
    ]


def test_cgroup_v2_only_host_is_one_mount():
    mounts = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0\n"
    assert cgroup_mount_commands(mounts) == [
        "mkdir -p /sys/fs/cgroup && mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup",
    ]


def test_mpi_sshd_container_mounts_the_node_key_and_the_authorized_key(make_inv):
    inv = with_cli(make_inv(2, runtime="docker", image="img:1"), PODMAN, ["--pull=never"])
    line = mpi_sshd_shell(inv, "node-1", "r3")
    assert line.startswith("mkdir -p /state/dev/nodes/node-1/home && "
                           f"{PODMAN} run -d --rm --name mn-r3-node-1-sshd --network=host --ipc=host ")
    # It starts as root (the host key is root's); the entrypoint adds the SSH user named by the node's shell.
    argv = shlex.split(line.split(" && ")[-1])
    assert "--user" not in argv
    assert ' -e MULTINODE_USER="$(id -un)" -e MULTINODE_UID="$(id -u)" -e MULTINODE_GID="$(id -g)" img:1 ' in line
    assert "HOME=/state/dev/nodes/node-1/home" in argv and "OMPI_MCA_btl_vader_single_copy_mechanism=none" in argv
    assert "-v /state/dev/nodes/node-1:/state/dev/nodes/node-1 " in line
    # Defaults suit a cloud node: its own host key, and $HOME expanded by the node's shell.
    assert "-v /etc/ssh/ssh_host_ed25519_key:/etc/multinode/ssh_host_ed25519_key:ro" in line
    assert '-v "$HOME/.ssh/authorized_keys:/etc/multinode/authorized_keys:ro" -e MULTINODE_USER=' in line
    assert line.endswith(" img:1 >/dev/null")
    local = dataclasses.replace(inv, extra={**inv.extra, "container_sshd": {
        "host_key": "/state/dev/provider/{node}/ssh_host_ed25519_key", "authorized_keys": "/state/dev/id_ed25519.pub"}})
    line = mpi_sshd_shell(local, "node-1", "r3")
    assert "-v /state/dev/provider/node-1/ssh_host_ed25519_key:/etc/multinode/ssh_host_ed25519_key:ro" in line
    assert '-v "/state/dev/id_ed25519.pub:/etc/multinode/authorized_keys:ro"' in line


def job_argv(inv, mode="cpu", node=0):
    plan, _ = plan_job(inv, LaunchSpec(mode=mode, nodes=2, run_id="r4"))
    line = to_shell(plan.commands[node], inv, "r4")
    return line, shlex.split(line.split("exec ", 1)[1])


def test_job_containers_run_as_the_nodes_ssh_user_with_a_home_in_the_work_directory(make_inv):
    """Issue 27, 1: as root (Docker's default) a job left root-owned files in the mounted work directory."""
    inv = make_inv(2, runtime="docker", image="img:1")
    line, argv = job_argv(inv)
    image_at = argv.index("img:1")
    # The uid and gid are the node's shell's, read where the line runs; the option precedes the image.
    assert argv[argv.index("--user") + 1] == "$(id -u):$(id -g)" and argv.index("--user") < image_at
    assert "HOME=/state/dev/nodes/node-0/home" in argv[:image_at]
    assert line.startswith("mkdir -p /state/dev/nodes/node-0/code /state/dev/nodes/node-0/home && ")
    # getpass.getuser() (torch inductor's cache) without a passwd entry; by value: sudo would pass its root.
    assert ' --user "$(id -u):$(id -g)" -e USER="$(id -un)" -e LOGNAME="$(id -un)" img:1 ' in line
    # AMD: the SSH user needs /dev/kfd's group (the host's render gid) that root never needed.
    line, argv = job_argv(make_inv(2, runtime="docker", accelerator="amd", image="img:1"), mode="gpu")
    assert '-e LOGNAME="$(id -un)" --group-add "$(stat -c %g /dev/kfd)" img:1 ' in line
    assert "$(stat" not in job_argv(make_inv(2, runtime="docker", accelerator="nvidia", image="img:1"), mode="gpu")[0]


def test_open_mpis_single_copy_is_off_in_every_job_container(make_inv):
    """Issue 27, 7: vader's CMA copy needs ptrace rights a container may lack (open-mpi/ompi issue 4948)."""
    inv = make_inv(2, runtime="docker", image="img:1")
    for mode in ("cpu", "mpi"):
        _, argv = job_argv(inv, mode=mode)
        at = argv.index("OMPI_MCA_btl_vader_single_copy_mechanism=none")
        assert argv[at - 1] == "-e" and at < argv.index("img:1")
    plan, _ = plan_job(inv, LaunchSpec(mode="mpi", nodes=2, run_id="r4"))
    mpirun = plan.commands[0].argv
    # mpirun's own --mca options would beat the environment: the launcher must not set this one.
    assert "btl_vader_single_copy_mechanism" not in mpirun
    assert "OMPI_MCA_btl_vader_single_copy_mechanism" not in to_shell(plan.commands[0], make_inv(2), "r4")  # host: untouched
