"""Each local node's own OpenSSH ``sshd``: its config, its host key, starting and stopping it.

One host key per node (``provider/<node>/ssh_host_ed25519_key``), pinned in the cluster's known_hosts
at `up`. As root the sshd runs in the node's network namespace under ``unshare --uts`` with the
node's hostname and its own copy-on-write home (:mod:`multinode.providers.local.home`), and, for
the docker runtime, the host's cgroup mounts (:mod:`multinode.providers.local.cgroups`); without
root it listens on a loopback address, port 2222.

:func:`stop_sshd` and :func:`start_sshd` are also fault injection for tests and drills.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from multinode.core.state import ClusterState
from multinode.providers.local.cgroups import cgroup_mount_commands
from multinode.providers.local.home import own_home_steps, user_home
from multinode.providers.local.meta import isolated, load_meta, login_user, net_plan, node_dir, node_index
from multinode.providers.local.netns import NetPlan

SSHD = "/usr/sbin/sshd"
LOOPBACK_PORT = 2222
READY_TIMEOUT = 15.0

SSHD_CONFIG = """\
# multinode local node {name}: sshd keeps the FIRST value of an option; all paths absolute.
ListenAddress {ip}
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
# Parallel fan-out (pre-flight, mpirun's remote launches, stop sweeps) opens many sessions at once.
MaxStartups 200
MaxSessions 200
UseDNS no
PrintMotd no
LogLevel ERROR
Subsystem sftp internal-sftp
"""


def write_sshd_files(state: ClusterState, plan: NetPlan, i: int, port: int) -> str:
    """Host key + config for node i; returns the public host key ("ssh-ed25519 AAAA...")."""
    ndir = node_dir(state, f"node-{i}")
    ndir.mkdir(parents=True, exist_ok=True)
    key = ndir / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", plan.hostname(i), "-f", str(key)], check=True)
    (ndir / "sshd_config").write_text(SSHD_CONFIG.format(
        name=f"node-{i}", ip=plan.ip(i), port=port, host_key=key, pid_file=ndir / "sshd.pid",
        authorized_keys=f"{state.ssh_key}.pub",
    ))
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


def _sshd_argv(state: ClusterState, plan: NetPlan, i: int) -> list[str]:
    ndir = node_dir(state, f"node-{i}")
    sshd = [SSHD, "-D", "-f", str(ndir / "sshd_config"), "-E", str(ndir / "sshd.log")]
    if not isolated():
        return sshd
    # Own UTS namespace: the node's hostname, inherited by every session (c10d resolves it). Own home (providers.local.home).
    meta = load_meta(state) or {}
    steps = [f"hostname {plan.hostname(i)}",
             *own_home_steps(user_home(meta.get("ssh_user") or login_user()), state.root, ndir)]
    if meta.get("containers"):
        steps = cgroup_mount_commands(Path("/proc/self/mounts").read_text()) + steps
    inner = " && ".join([*steps, f"exec {' '.join(sshd)}"])
    return ["ip", "netns", "exec", plan.netns(i), "unshare", "--uts", "sh", "-c", inner]


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_sshds(state: ClusterState, plan: NetPlan, indices: list[int], port: int) -> None:
    """Start the sshd of nodes ``indices`` and wait until each accepts connections (RuntimeError naming its log)."""
    if isolated():
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    for i in indices:
        subprocess.Popen(_sshd_argv(state, plan, i), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    end = time.monotonic() + READY_TIMEOUT
    waiting = list(indices)
    while waiting and time.monotonic() < end:
        waiting = [i for i in waiting if not _port_open(plan.ip(i), port)]
        time.sleep(0.05 if waiting else 0)
    if waiting:
        i = waiting[0]
        log = node_dir(state, f"node-{i}") / "sshd.log"
        detail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
        raise RuntimeError(f"sshd of node-{i} ({plan.ip(i)}:{port}) did not start: {' '.join(detail) or 'no log'}")


def _sshd_pid(state: ClusterState, node: str) -> int | None:
    pid_file = node_dir(state, node) / "sshd.pid"
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop_sshd_process(state: ClusterState, node: str) -> int:
    """SIGTERM the node's sshd by its pid file and wait up to 3 s for it to go; 1 if there was one, else 0."""
    pid = _sshd_pid(state, node)
    if pid is None:
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    end = time.monotonic() + 3
    while time.monotonic() < end and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    return 1


def stop_sshd(state: ClusterState, node: str) -> None:
    """Make a node unreachable over SSH (its other processes keep running)."""
    plan = net_plan(state)
    stop_sshd_process(state, node)
    port = load_meta(state)["port"]
    end = time.monotonic() + 3
    while _port_open(plan.ip(node_index(node)), port) and time.monotonic() < end:
        time.sleep(0.05)


def start_sshd(state: ClusterState, node: str) -> None:
    start_sshds(state, net_plan(state), [node_index(node)], load_meta(state)["port"])
