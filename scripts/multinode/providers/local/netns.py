"""The simulated cluster network: one network namespace per node on a Linux bridge (root only).

Pure part: :class:`NetPlan` derives every name and address from the cluster name, so `down`
finds everything even when `up` crashed before writing anything else, and clusters (and
concurrent tests) never collide:

    namespace  mn-<cluster>-<i>          node i, hostname <cluster>-node-<i>
    bridge     mnb<hash6>                 holds <subnet>.1
    veth       mnh<hash6><i> (host side) / eth0 (inside the namespace)
    subnet     10.<200..249>.<x>.0/24     node i at .10+i; the first free one on this host
    MAC        02:<hash6>:00:<i>          node i's eth0 (a replacement of node i gets it again)

The network is closed: namespaces get no default route, only their subnet, and the host's
``ip_forward`` is never touched, so a node can reach its peers and nothing else.
Each namespace gets its own ``/etc/netns/<ns>/{hosts,resolv.conf}`` (every node's hostname by its IPv4 address
and its IPv4-mapped IPv6 one, so reverse lookups of peers succeed: :meth:`NetPlan.hosts_file`; nameserver
127.0.0.1 so any other lookup fails at once instead of waiting for an unreachable DNS).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from multinode.core.errors import UserError

NETNS_ETC = Path("/etc/netns")
FIRST_HOST = 10


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


def _hash(cluster: str) -> str:
    return hashlib.sha256(cluster.encode()).hexdigest()[:6]


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this host already has an address or a route in."""
    nets = []
    for line in run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        nets.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in run("ip", "-4", "route", "show").stdout.splitlines():
        dest = line.split()[0]
        if dest != "default":
            nets.append(ipaddress.ip_network(dest if "/" in dest else f"{dest}/32", strict=False))
    return nets


def pick_subnet(cluster: str, taken: list[ipaddress.IPv4Network], base_octet: int = 10) -> ipaddress.IPv4Network:
    """A /24 derived from the cluster name; the next one if it overlaps a network of this host."""
    start = int(_hash(cluster), 16) % (50 * 256)
    for offset in range(50 * 256):
        slot = (start + offset) % (50 * 256)
        net = ipaddress.ip_network(f"{base_octet}.{200 + slot // 256}.{slot % 256}.0/24")
        if not any(net.overlaps(other) for other in taken):
            return net
    raise UserError(f"no free 10.200-249.x.0/24 subnet on this host for cluster {cluster!r}; run 'make down' on old clusters")


@dataclass(frozen=True)
class NetPlan:
    """Names and addresses of a local cluster's network (pure: no I/O)."""

    cluster: str
    nodes: int
    subnet: str
    mtu: int

    @property
    def tag(self) -> str:
        return _hash(self.cluster)

    @property
    def bridge(self) -> str:
        return f"mnb{self.tag}"

    @property
    def gateway(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def netns(self, i: int) -> str:
        return f"mn-{self.cluster}-{i}"

    def veth(self, i: int) -> str:
        return f"mnh{self.tag}{i}"  # <= 15 chars (IFNAMSIZ) for up to 64 nodes

    def ip(self, i: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[FIRST_HOST + i])

    def mac(self, i: int) -> str:
        """Node i's MAC address on the cluster network (locally administered, from the cluster's tag and i): the
        same for a replacement of node i, so its peers' and the host's ARP entries for its IP stay right (with a
        new MAC they pointed at the lost node until they expired, and nothing reached the new node meanwhile)."""
        t = self.tag
        return f"02:{t[0:2]}:{t[2:4]}:{t[4:6]}:00:{i:02x}"

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC, set at creation (locally administered, apart from every node's :meth:`mac`). A bridge
        left to itself takes the lowest MAC of its ports and changes it when that port goes -- a lost node's veth --
        while every node's ARP entry for the gateway still names the old one: their packets to the host (the run's
        SSH sessions) were dropped ~6.5 s, until the entry was probed again (the recovery benchmark's row (c), 8 runs
        of 13). A user-set address is kept (the kernel's br_stp_recalculate_bridge_id returns early for an address
        of type NET_ADDR_SET; /sys/class/net/<bridge>/addr_assign_type reads 3)."""
        t = self.tag
        return f"02:{t[0:2]}:{t[2:4]}:{t[4:6]}:01:00"

    def hostname(self, i: int) -> str:
        return f"{self.cluster}-node-{i}"

    def hosts_file(self) -> str:
        """Every node's name by its address, and again by the address as a dual-stack socket sees it
        (``::ffff:10.x.y.z``): c10d's TCPStore listens on ``::`` and names each peer with getnameinfo, which
        glibc's hosts-file backend does not map back to IPv4 (its DNS backend does, so a cloud's DNS answers);
        without those lines every lookup fell through to DNS, failed, and every rank printed "The hostname
        of the client socket cannot be retrieved". Forward lookups still give the IPv4 address first."""
        names = [("127.0.0.1", "localhost"), *((self.ip(i), self.hostname(i)) for i in range(self.nodes))]
        lines = [f"{ip} {name}" for ip, name in names] + ["::1 localhost"]
        lines += [f"::ffff:{ip} {name}" for ip, name in names]
        return "\n".join(lines) + "\n"


def namespaces_of(cluster: str) -> list[str]:
    """This cluster's namespaces that exist now, in node order."""
    pattern = re.compile(rf"^mn-{re.escape(cluster)}-(\d+)$")
    found = []
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        match = pattern.match(line.split()[0]) if line.strip() else None
        if match:
            found.append((int(match[1]), match[0]))
    return [name for _, name in sorted(found)]


def links_of(cluster: str) -> list[str]:
    """This cluster's bridge and host-side veths that exist now."""
    tag = _hash(cluster)
    names = []
    for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == f"mnb{tag}" or re.fullmatch(rf"mnh{tag}\d+", name):
            names.append(name)
    return names


def netns_pids(ns: str) -> list[int]:
    return [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]


def create(plan: NetPlan) -> None:
    """Bridge, then every node (:func:`create_node`). Raises on the first failure."""
    run("ip", "link", "add", plan.bridge, "address", plan.bridge_mac, "type", "bridge")  # its MAC never moves
    run("ip", "link", "set", plan.bridge, "mtu", str(plan.mtu))
    run("ip", "addr", "add", f"{plan.gateway}/{plan.prefixlen}", "dev", plan.bridge)
    run("ip", "link", "set", plan.bridge, "up")
    for i in range(plan.nodes):
        create_node(plan, i)


def create_node(plan: NetPlan, i: int) -> None:
    """Node i on the cluster's bridge: its hosts/resolv.conf/hostname, namespace, veth pair and address (what `up`
    does for each node, and a replacement for one). Raises on the first failure."""
    ns, veth, peer = plan.netns(i), plan.veth(i), f"mnp{plan.tag}{i}"
    etc = NETNS_ETC / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(plan.hosts_file())
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    (etc / "hostname").write_text(plan.hostname(i) + "\n")
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", veth, "mtu", str(plan.mtu), "type", "veth", "peer", "name", peer, "mtu", str(plan.mtu))
    run("ip", "link", "set", veth, "master", plan.bridge, "up")
    run("ip", "link", "set", peer, "netns", ns)
    batch = "\n".join([
        "link set lo up",
        f"link set {peer} name eth0",
        f"link set eth0 address {plan.mac(i)}",
        f"addr add {plan.ip(i)}/{plan.prefixlen} dev eth0",
        "link set eth0 up",
    ])
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, text=True, check=True, capture_output=True)


def destroy_node(plan: NetPlan, i: int, warn: bool = True) -> int:
    """Node i gone: every process in its namespace stopped (``warn``: SIGTERM first, else SIGKILL at once, as a
    machine that vanishes), its veth (first: see :func:`destroy`) and namespace deleted, its /etc/netns entry
    removed. The bridge and the other nodes stay. Idempotent; returns how many processes there were."""
    ns = plan.netns(i)
    processes = stop_processes([ns], grace=1.0 if warn else 0.0, warn=warn) if ns in namespaces_of(plan.cluster) else 0
    run("ip", "link", "del", plan.veth(i), check=False)
    run("ip", "netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    return processes


def stop_processes(namespaces: list[str], grace: float = 1.0, warn: bool = True) -> int:
    """SIGTERM everything in the namespaces, then SIGKILL what is left (``warn=False``: a machine that vanishes,
    every process frozen first -- :func:`freeze` -- then SIGKILL); a process that appears meanwhile (a child forked
    before its parent died) gets the same signal. Returns how many processes there were."""
    import os
    import signal

    seen: set[int] = set() if warn else freeze(namespaces)
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)) if warn else ((signal.SIGKILL, 3.0),)
    for sig, wait in steps:
        signalled: set[int] = set()
        end = time.monotonic() + wait
        while True:
            current = {pid for ns in namespaces for pid in netns_pids(ns)}
            if not current:
                return len(seen)
            seen |= current
            for pid in current - signalled:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            signalled |= current
            if time.monotonic() >= end:
                break
            time.sleep(0.05)
    return len(seen)


def freeze(namespaces: list[str]) -> set[int]:
    """SIGSTOP every process in the namespaces, again for those that appear, until a listing finds none new (a
    stopped process forks nothing); returns them. A vanishing machine's processes all stop at once; killed one by
    one, a process that outlived its neighbour acted on its death -- a starter read its rank's missing exit file,
    a rank wrote into its killed ``sed`` (EPIPE, exit 1) -- and sent that through a still-living sshd as the job's
    own failure. Frozen first, none runs again: SIGKILL ends a stopped process, and the kernel acts on a pending
    SIGSTOP before the process runs another instruction of its own."""
    import os
    import signal

    stopped: set[int] = set()
    while new := {pid for ns in namespaces for pid in netns_pids(ns)} - stopped:
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped |= new
    return stopped


def destroy(cluster: str) -> tuple[int, int, int]:
    """Remove the cluster's veths (first: `ip netns del` frees them asynchronously), namespaces,
    bridge and /etc/netns entries. Idempotent. Returns (namespaces, links, processes) removed."""
    namespaces = namespaces_of(cluster)
    processes = stop_processes(namespaces)
    links = links_of(cluster)
    tag = _hash(cluster)
    for link in sorted(links, key=lambda name: name.startswith(f"mnb{tag}")):  # veths, then the bridge
        run("ip", "link", "del", link, check=False)
    for ns in namespaces:
        run("ip", "netns", "del", ns, check=False)
    for etc in NETNS_ETC.glob(f"mn-{cluster}-*"):
        if re.fullmatch(rf"mn-{re.escape(cluster)}-\d+", etc.name):
            shutil.rmtree(etc, ignore_errors=True)
    return len(namespaces), len(links), processes
