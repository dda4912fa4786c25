"""What `up` records about a local cluster, and where its nodes' files are (no processes, no network).

``.multinode/<cluster>/provider/local.json`` (written first, so `down` can clean up after a crashed
`up`): node count, subnet, MTU, sshd port, whether the nodes are namespaces (``isolated``) and
whether they run containers. Each node has its own directory ``provider/<node>/`` (sshd config,
host key, pid file, log, copy-on-write home).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from multinode.core.errors import UserError
from multinode.core.inventory import node_index  # the one parser of node names; the local modules take it from here
from multinode.core.state import ClusterState
from multinode.providers.local.netns import NetPlan


def isolated() -> bool:
    """Namespaces need root; without it we fall back to loopback addresses."""
    return os.geteuid() == 0


def meta_path(state: ClusterState) -> Path:
    return state.provider_dir / "local.json"


def load_meta(state: ClusterState) -> dict | None:
    path = meta_path(state)
    return json.loads(path.read_text()) if path.exists() else None


def net_plan(state: ClusterState) -> NetPlan:
    """The network plan of a cluster that is up (UserError otherwise)."""
    meta = load_meta(state)
    if meta is None:
        raise UserError(f"cluster {state.name!r} is not up; run 'make up' first")
    return NetPlan(state.name, meta["nodes"], meta["subnet"], meta["mtu"])


def node_dir(state: ClusterState, name: str) -> Path:
    return state.provider_dir / name


def login_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


@contextlib.contextmanager
def node_change(state: ClusterState, name: str) -> Iterator[None]:
    """One change of node ``name``'s life at a time, across processes (``flock`` on ``provider/<node>.lock``, beside
    the node's directory, which a replacement wipes): a replacement made by the run, the node lost by a drill.
    Without it the run, quick to see the loss, removed what was left of the node and made the new one while the
    drill was still deleting the old one's link and namespace -- by name, the new ones (a replacement started the
    moment the old node's processes were gone lost its node 6 times in 6)."""
    state.provider_dir.mkdir(parents=True, exist_ok=True)
    with open(state.provider_dir / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
