"""The local provider: a simulated cluster of N nodes on this machine, the embedded default.

As root, each node is a network namespace on a bridge (see :mod:`multinode.providers.local.netns`) with
its own IP, its own hostname (a UTS namespace) and its own real OpenSSH ``sshd``
(:mod:`multinode.providers.local.sshd`); nodes share this machine's filesystem but each gets its own work
directory, so nothing relies on sharing, and its own copy-on-write home directory
(:mod:`multinode.providers.local.home`: login shells write there as on separate machines). Without root,
each node is an ``sshd`` on its own loopback address (127.x.y.10+i, port 2222): same inventory,
no isolation, one hostname -- `up` says so.

Keys: one ed25519 client key per cluster; one host key per node, pinned in the cluster's
known_hosts by IP and hostname at `up` (a changed key is refused by every client we run).

State (``.multinode/<cluster>/provider/``): ``local.json`` (written first, so `down` can clean
up after a crashed `up`; :mod:`multinode.providers.local.meta`), per-node sshd config, host key, pid
file and log, and ``nodes/<node>/`` work directories. `down` stops every process in the namespaces,
removes links, namespaces and files, and verifies with :func:`leftovers` that nothing is left.

Containers (``-o runtime=docker -o image=REF [-o container_cli="podman ..."] [-o container_args=...]``):
jobs run in the image on each node with the host network; the nodes' namespaces get the host's
cgroup mounts back (runc needs them: :mod:`multinode.providers.local.cgroups`), and MODE=mpi reaches
the image's sshd on port 2222.

``-o ssh_user=NAME`` (root only): the nodes are logged into as that existing user of this machine, not as
root -- what a cloud node's ``ubuntu`` is -- and its work directories are that user's. With the docker runtime
the user needs the container CLI as root, as ``ubuntu`` has Docker's socket: e.g.
``-o container_cli="sudo -n podman ..."`` with a sudoers rule (tests/integration/test_container_owner.py).

`replace` (the recovery of a lost node, :mod:`multinode.providers.local.node`): what is left of the node
(namespace, sshd, every process in it, its files) is removed and ONE new node is made under the SAME name and
private IP -- hosts files and rank order stay -- with a new namespace, sshd and host key (re-pinned in
known_hosts), empty work directory and home, and its metadata endpoint again if the cluster served one. The
other nodes are not touched (same namespaces, same sshd processes). SCHEDULER=slurm clusters are not replaced.

Fault injection for tests and drills: :mod:`multinode.providers.local.faults` (a crash, a cut link, a lost node,
a provider told to refuse replacements) and :func:`multinode.providers.local.sshd.stop_sshd` / ``start_sshd``.
"""

from __future__ import annotations

import json
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from multinode.core.config import ClusterSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory, node_index
from multinode.core.state import ClusterState
from multinode.providers.base import Estimate
from multinode.providers.local import netns as localnet
from multinode.providers.local import imds
from multinode.providers.local import faults
from multinode.providers.local import slurm as slurm_local
from multinode.providers.local.meta import isolated, load_meta, login_user, meta_path
from multinode.providers.local.netns import NetPlan, namespaces_of
from multinode.providers.local.node import node_files, replace_node, write_known_hosts
from multinode.providers.local.sshd import LOOPBACK_PORT, start_sshds, stop_sshd_process


class LocalProvider:
    name = "local"

    def up(self, spec: ClusterSpec, state: ClusterState) -> Inventory:
        if not isolated():
            print("warning: not root: local nodes are sshd processes on loopback addresses "
                  "(no network namespaces, one hostname); run as root for real isolation", file=sys.stderr)
        if meta_path(state).exists() or namespaces_of(spec.name) or localnet.links_of(spec.name):
            raise UserError(f"cluster {spec.name!r} has leftovers from a previous up; run 'make down' first")
        if spec.nodes > 64:
            raise UserError(f"NODES={spec.nodes}: the local provider makes at most 64 nodes")
        _check_scheduler(spec.options.get("scheduler"))
        ssh_user = _check_ssh_user(spec.options.get("ssh_user"))
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
        meta_path(state).write_text(json.dumps(
            {"nodes": spec.nodes, "subnet": subnet, "mtu": spec.mtu, "port": port, "isolated": isolated(),
             "containers": spec.options.get("runtime") == "docker", "ssh_user": ssh_user}, indent=2))
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
        ssh_user = spec.options.get("ssh_user") or login_user()
        nodes = tuple(node_files(state, plan, i, port, ssh_user) for i in range(plan.nodes))
        write_known_hosts(state, plan, nodes, port)
        start_sshds(state, plan, list(range(plan.nodes)), port)
        options = dict(spec.options)
        options.pop("ssh_user", None)
        runtime = options.pop("runtime", "host")
        options.pop("scheduler", None)
        extra: dict = {"isolated": isolated(), "mtu": plan.mtu, "bridge": plan.bridge if isolated() else None,
                       "namespaces": [plan.netns(i) for i in range(plan.nodes)] if isolated() else []}
        if isolated():  # each node can serve EC2's instance metadata paths (spot notices): make preempt arms one
            extra["metadata_endpoint"] = imds.ENDPOINT
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
            # Another login user cannot run this venv (it may lie in root's home): the node's python3, as on AWS.
            workdir=f"{state.provider_dir}/nodes/{{node}}", python="python3" if "ssh_user" in spec.options else sys.executable,
            runtime=runtime, image=options.pop("image", None), extra=extra,
        )
        inventory.save(state.inventory_path)
        return inventory

    def replace(self, state: ClusterState, inventory: Inventory, name: str, retire=None) -> Inventory:
        """One new node for ``name`` under the same name and private IP (:mod:`multinode.providers.local.node`);
        the others untouched. CapacityRefused when told to refuse (:mod:`multinode.providers.local.faults`).
        With ``retire``, the drilled launch (MULTINODE_REPLACE_DELAY) runs beside the old node, which is removed
        only once ``retire`` returns."""
        return replace_node(state, inventory, name, retire)

    def replacement_estimate(self, state: ClusterState, inventory: Inventory) -> Estimate:
        """``MULTINODE_REPLACE_DELAY`` when a drill sets one (an EC2 launch, drilled); the local node itself is made
        at once (about a second, within a restart's own seconds, so it is not counted)."""
        delay = faults.replace_delay()
        return Estimate(delay, f"{faults.DELAY_ENV}={delay:g}, a drilled launch" if delay else
                        "a local node is made at once")

    def gone(self, state: ClusterState, inventory: Inventory, names: list[str]) -> dict[str, str]:
        """The nodes whose network namespace no longer exists (lost: faults.lose_node, or removed by hand)."""
        if not inventory.extra.get("namespaces"):
            return {}  # a loopback cluster: nothing to look at
        alive = set(namespaces_of(state.name))
        spaces = inventory.extra["namespaces"]  # by node index, whatever part of the cluster ``inventory`` holds
        return {n.name: "its network namespace is gone" for n in inventory.nodes
                if n.name in names and spaces[node_index(n.name)] not in alive}

    def down(self, state: ClusterState, yes: bool = False) -> list[str]:  # yes: nothing local holds user data
        """Remove everything of the cluster by its name (namespaces, links, /etc/netns entries and processes
        are all named after it): works without the inventory, and with a damaged local.json."""
        try:
            meta = load_meta(state)
        except (OSError, ValueError):
            meta = None
        lines = []
        if not isolated() or (meta is not None and not meta.get("isolated", True)):
            nodes = sorted(p.name for p in state.provider_dir.glob("node-*") if p.is_dir())
            stopped = sum(stop_sshd_process(state, node) for node in nodes)
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


def _check_ssh_user(user: str | None) -> str:
    """``-o ssh_user=NAME``: an existing user of this machine, and namespaces (root) to log in to it."""
    if user is None:
        return login_user()
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise UserError(f"-o ssh_user={user}: no such user on this machine; create it (useradd {user}) "
                        "or leave ssh_user unset") from None
    if not isolated():
        raise UserError(f"-o ssh_user={user} needs root (each node's sshd logs users in); run as root or leave it unset")
    return user


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


# --- what is left ----------------------------------------------------------------------


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



__all__ = ["LocalProvider", "leftovers"]
