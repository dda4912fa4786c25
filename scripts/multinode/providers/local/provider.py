"""The local provider: a simulated cluster of N nodes on this machine, the embedded default.

As root, each node is a network namespace on a bridge (see :mod:`localnet`) with its own IP, its
own hostname (a UTS namespace) and its own real OpenSSH ``sshd``; nodes share this machine's
filesystem but each gets its own work directory, so nothing relies on sharing, and its own copy-on-write home
directory (:mod:`nodehome`: login shells write there as on separate machines). Without root,
each node is an ``sshd`` on its own loopback address (127.x.y.10+i, port 2222): same inventory,
no isolation, one hostname -- `up` says so.

Keys: one ed25519 client key per cluster; one host key per node, pinned in the cluster's
known_hosts by IP and hostname at `up` (a changed key is refused by every client we run).

State (``.multinode/<cluster>/provider/``): ``local.json`` (written first, so `down` can clean
up after a crashed `up`), per-node sshd config, host key, pid file and log, and ``nodes/<node>/``
work directories. `down` stops every process in the namespaces, removes links, namespaces and
files, and verifies with :func:`leftovers` that nothing is left.

Containers (``-o runtime=docker -o image=REF [-o container_cli="podman ..."] [-o container_args=...]``):
jobs run in the image on each node with the host network; the nodes' namespaces get the host's
cgroup mounts back (runc needs them), and MODE=mpi reaches the image's sshd on port 2222.

Fault injection for tests and drills: :func:`stop_sshd`, :func:`start_sshd`, :func:`set_link`,
:func:`kill_node`, :func:`node_pids`, :func:`job_pids`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from multinode.core.config import ClusterSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, Node
from multinode.providers.local import netns as localnet
from multinode.providers.local import slurm as slurm_local
from multinode.providers.local.netns import NetPlan, namespaces_of
from multinode.providers.local.home import own_home_steps, user_home
from multinode.core.state import ClusterState

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


def isolated() -> bool:
    """Namespaces need root; without it we fall back to loopback addresses."""
    return os.geteuid() == 0


def _meta_path(state: ClusterState) -> Path:
    return state.provider_dir / "local.json"


def _load_meta(state: ClusterState) -> dict | None:
    path = _meta_path(state)
    return json.loads(path.read_text()) if path.exists() else None


def _plan(state: ClusterState) -> NetPlan:
    meta = _load_meta(state)
    if meta is None:
        raise UserError(f"cluster {state.name!r} is not up; run 'make up' first")
    return NetPlan(state.name, meta["nodes"], meta["subnet"], meta["mtu"])


def _node_dir(state: ClusterState, name: str) -> Path:
    return state.provider_dir / name


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


# --- sshd per node ---------------------------------------------------------------------


def _write_sshd_files(state: ClusterState, plan: NetPlan, i: int, port: int) -> str:
    """Host key + config for node i; returns the public host key ("ssh-ed25519 AAAA...")."""
    ndir = _node_dir(state, f"node-{i}")
    ndir.mkdir(parents=True, exist_ok=True)
    key = ndir / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", plan.hostname(i), "-f", str(key)], check=True)
    (ndir / "sshd_config").write_text(SSHD_CONFIG.format(
        name=f"node-{i}", ip=plan.ip(i), port=port, host_key=key, pid_file=ndir / "sshd.pid",
        authorized_keys=f"{state.ssh_key}.pub",
    ))
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


CGROUP_ROOT = "/sys/fs/cgroup"
# Mount flags that are not filesystem options: dropped when a cgroup mount is repeated.
GENERIC_MOUNT_FLAGS = {"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "seclabel"}


def cgroup_mount_commands(mounts: str) -> list[str]:
    """Shell commands that mount again, in a node's namespace, the cgroup filesystems in ``mounts``.

    ``ip netns exec`` mounts a fresh sysfs on /sys, which hides /sys/fs/cgroup; container runtimes
    (runc, crun) refuse to start without it. Mounting a cgroup hierarchy a second time attaches
    to the same hierarchy, so the node's containers are accounted as on the host.
    ``mounts`` is the text of /proc/self/mounts (cgroup v1 layout, v2, or hybrid).
    """
    commands = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in {"tmpfs", "cgroup", "cgroup2"}:
            continue
        source, target, fstype, flags = fields[:4]
        if target != CGROUP_ROOT and not target.startswith(CGROUP_ROOT + "/"):
            continue
        options = [o for o in flags.split(",") if o not in GENERIC_MOUNT_FLAGS]
        if fstype == "cgroup" and all(o.startswith("name=") for o in options):
            options.insert(0, "none")  # a named hierarchy without controllers (name=systemd)
        opts = f" -o {shlex.quote(','.join(options))}" if options else ""
        commands.append(f"mkdir -p {shlex.quote(target)} && mount -t {fstype}{opts} {shlex.quote(source)} {shlex.quote(target)}")
    return commands


def _sshd_argv(state: ClusterState, plan: NetPlan, i: int) -> list[str]:
    ndir = _node_dir(state, f"node-{i}")
    sshd = [SSHD, "-D", "-f", str(ndir / "sshd_config"), "-E", str(ndir / "sshd.log")]
    if not isolated():
        return sshd
    # Own UTS namespace: the node's hostname, inherited by every session (c10d resolves it). Own home (nodehome).
    steps = [f"hostname {plan.hostname(i)}",
             *own_home_steps(user_home(_user()), state.root, ndir)]
    if (_load_meta(state) or {}).get("containers"):
        steps = cgroup_mount_commands(Path("/proc/self/mounts").read_text()) + steps
    inner = " && ".join([*steps, f"exec {' '.join(sshd)}"])
    return ["ip", "netns", "exec", plan.netns(i), "unshare", "--uts", "sh", "-c", inner]


def _port_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_sshds(state: ClusterState, plan: NetPlan, indices: list[int], port: int) -> None:
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
        log = _node_dir(state, f"node-{i}") / "sshd.log"
        detail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
        raise RuntimeError(f"sshd of node-{i} ({plan.ip(i)}:{port}) did not start: {' '.join(detail) or 'no log'}")


# --- provider ------------------------------------------------------------------------


class LocalProvider:
    name = "local"

    def up(self, spec: ClusterSpec, state: ClusterState) -> Inventory:
        if not isolated():
            print("warning: not root: local nodes are sshd processes on loopback addresses "
                  "(no network namespaces, one hostname); run as root for real isolation", file=sys.stderr)
        if _meta_path(state).exists() or namespaces_of(spec.name) or localnet.links_of(spec.name):
            raise UserError(f"cluster {spec.name!r} has leftovers from a previous up; run 'make down' first")
        if spec.nodes > 64:
            raise UserError(f"NODES={spec.nodes}: the local provider makes at most 64 nodes")
        _check_scheduler(spec.options.get("scheduler"))
        if isolated():
            subnet = str(localnet.pick_subnet(spec.name, localnet.host_networks()))
            port = 22
        else:
            subnet = str(localnet.pick_subnet(spec.name, [], base_octet=127))
            port = LOOPBACK_PORT
        plan = NetPlan(spec.name, spec.nodes, subnet, spec.mtu)
        state.provider_dir.mkdir(parents=True, exist_ok=True)
        # Written before anything is created: `down` finds the cluster even if `up` dies half-way.
        # "containers": the docker runtime; node namespaces then get the host's cgroup mounts back.
        _meta_path(state).write_text(json.dumps(
            {"nodes": spec.nodes, "subnet": subnet, "mtu": spec.mtu, "port": port, "isolated": isolated(),
             "containers": spec.options.get("runtime") == "docker"}, indent=2))
        try:
            return self._create(spec, state, plan, port)
        except BaseException:
            self.down(state)
            raise

    def _create(self, spec: ClusterSpec, state: ClusterState, plan: NetPlan, port: int) -> Inventory:
        if not state.ssh_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"multinode-{spec.name}",
                            "-f", str(state.ssh_key)], check=True)
        scheduler = spec.options.get("scheduler")
        if isolated():
            localnet.create(plan)
        slurm = slurm_local.prepare(state, plan) if scheduler == "slurm" else None  # before sshd: see slurm_local
        host_keys = [_write_sshd_files(state, plan, i, port) for i in range(plan.nodes)]
        known = []
        for i, key in enumerate(host_keys):
            names = [plan.ip(i), plan.hostname(i)] if port == 22 else [f"[{plan.ip(i)}]:{port}"]
            known.append(f"{','.join(names)} {key}\n")
        state.known_hosts.write_text("".join(known))
        _start_sshds(state, plan, list(range(plan.nodes)), port)
        nodes = tuple(
            Node(name=f"node-{i}", hostname=plan.hostname(i) if isolated() else socket.gethostname(),
                 private_ip=plan.ip(i), ssh_user=_user(), ssh_port=port, host_key=host_keys[i])
            for i in range(plan.nodes)
        )
        for node in nodes:
            (state.provider_dir / "nodes" / node.name).mkdir(parents=True, exist_ok=True)
        options = dict(spec.options)
        runtime = options.pop("runtime", "host")
        options.pop("scheduler", None)
        extra: dict = {"isolated": isolated(), "mtu": plan.mtu, "bridge": plan.bridge if isolated() else None,
                       "namespaces": [plan.netns(i) for i in range(plan.nodes)] if isolated() else []}
        if slurm is not None:
            extra.update(slurm_local.start(state, plan, slurm))
        if runtime == "docker":
            extra["container_cli"] = options.pop("container_cli", "podman")
            # Both are command-line fragments: "podman --root DIR --runtime runc", "--ulimit nofile=4096:4096".
            extra["container_args"] = shlex.split(options.pop("container_args", ""))
            # MODE=mpi: mpirun in the head's container SSHes to the image's sshd on port 2222 (see
            # docker/sshd_config) of the other nodes, which presents the node's own host key; the head reads the cluster key and
            # known_hosts from its work directory, the one directory its container mounts.
            head_dir = f"{state.provider_dir}/nodes/{nodes[0].name}"
            extra.update(
                mpi_ssh_port=2222, mpi_ssh_key=f"{head_dir}/.ssh/id_ed25519", mpi_known_hosts=f"{head_dir}/.ssh/known_hosts",
                container_sshd={"host_key": f"{state.provider_dir}/{{node}}/ssh_host_ed25519_key",
                                "authorized_keys": f"{state.ssh_key}.pub"},
            )
        inventory = Inventory(
            cluster=spec.name, provider=self.name, nodes=nodes, subnet=plan.subnet,
            ssh_key=str(state.ssh_key), known_hosts=str(state.known_hosts),
            workdir=f"{state.provider_dir}/nodes/{{node}}", python=sys.executable,
            runtime=runtime, image=options.pop("image", None), extra=extra,
        )
        inventory.save(state.inventory_path)
        return inventory

    def down(self, state: ClusterState, yes: bool = False) -> list[str]:  # yes: nothing local holds user data
        """Remove everything of the cluster by its name (namespaces, links, /etc/netns entries and processes
        are all named after it): works without the inventory, and with a damaged local.json."""
        try:
            meta = _load_meta(state)
        except (OSError, ValueError):
            meta = None
        lines = []
        if not isolated() or (meta is not None and not meta.get("isolated", True)):
            nodes = sorted(p.name for p in state.provider_dir.glob("node-*") if p.is_dir())
            stopped = sum(_stop_sshd(state, node) for node in nodes)
            lines.append(f"stopped {stopped} sshd on loopback addresses")
        else:
            namespaces, links, processes = localnet.destroy(state.name)
            slurm_local.remove(state.name)
            lines.append(f"removed {namespaces} namespaces, {links} links; stopped {processes} processes")
        for path in (state.inventory_path, state.ssh_key, Path(f"{state.ssh_key}.pub"), state.known_hosts):
            path.unlink(missing_ok=True)
        shutil.rmtree(state.provider_dir, ignore_errors=True)
        left = leftovers(state.name)
        lines.append("nothing left" if not left else "LEFT OVER: " + ", ".join(left))
        if left:
            raise UserError(f"cluster {state.name!r} could not be fully removed: {', '.join(left)}; run 'make down' again")
        return lines


SCHEDULERS = ("slurm",)


def _check_scheduler(scheduler: str | None) -> None:
    """SCHEDULER=slurm needs namespaces (root) and the SLURM/munge daemons installed."""
    if scheduler is None:
        return
    if scheduler not in SCHEDULERS:
        raise UserError(f"SCHEDULER={scheduler!r} is not a scheduler; use SCHEDULER=slurm or leave it unset")
    if not isolated():
        raise UserError("SCHEDULER=slurm needs root (its daemons run in the nodes' namespaces); run as root")
    missing = slurm_local.missing_daemons()
    if missing:
        raise UserError(f"SCHEDULER=slurm but {', '.join(missing)} is not installed; run 'make setup' "
                        "(apt-get install slurmctld slurmd slurm-client munge)")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


# --- what is left, fault injection ------------------------------------------------------


def _our_processes(cluster: str) -> list[int]:
    """Processes started from this cluster's state directory (its sshds, and anything run from there)."""
    marker = f"/{cluster}/provider/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def leftovers(cluster: str) -> list[str]:
    """Everything of the cluster that still exists: [] after a clean `down`."""
    left = [f"namespace {ns}" for ns in namespaces_of(cluster)]
    left += [f"link {link}" for link in localnet.links_of(cluster)]
    left += [f"process {pid}" for pid in _our_processes(cluster)]
    left += [f"dir {p}" for p in localnet.NETNS_ETC.glob(f"mn-{cluster}-*")]
    left += slurm_local.leftovers(cluster)  # the munge socket directory (its daemons are processes above)
    return left


def node_pids(state: ClusterState, node: str) -> list[int]:
    """Every process of a node (its sshd included)."""
    return localnet.netns_pids(_plan(state).netns(_index(node)))


def job_pids(state: ClusterState, node: str) -> list[int]:
    """A node's processes other than sshd: empty whenever no job runs on it."""
    pids = []
    for pid in node_pids(state, node):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                pids.append(pid)
        except OSError:
            continue
    return pids


def _sshd_pid(state: ClusterState, node: str) -> int | None:
    pid_file = _node_dir(state, node) / "sshd.pid"
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_sshd(state: ClusterState, node: str) -> int:
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
    plan = _plan(state)
    _stop_sshd(state, node)
    port = _load_meta(state)["port"]
    end = time.monotonic() + 3
    while _port_open(plan.ip(_index(node)), port) and time.monotonic() < end:
        time.sleep(0.05)


def start_sshd(state: ClusterState, node: str) -> None:
    _start_sshds(state, _plan(state), [_index(node)], _load_meta(state)["port"])


def set_link(state: ClusterState, node: str, up: bool) -> None:
    """Cut (or restore) a node's only link to the cluster."""
    localnet.run("ip", "link", "set", _plan(state).veth(_index(node)), "up" if up else "down")


def kill_node(state: ClusterState, node: str) -> int:
    """SIGKILL every process of the node except its sshd, as if the machine's workload crashed."""
    pids = job_pids(state, node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


__all__ = [
    "LocalProvider", "job_pids", "kill_node", "leftovers", "namespaces_of", "node_pids", "set_link",
    "start_sshd", "stop_sshd",
]
