"""Each local node's home directory: its own, as on a cluster of separate machines.

A local node's sshd runs in a mount namespace of its own (``ip netns exec`` makes one), and there the login
user's home is an overlay: this machine's home as the lower layer, read-only, and an upper layer of the node's
own under the cluster's state directory. Every login shell on the node sees the user's files and rc files as
they are, and what it writes (pyenv's shims and their lock file, pip's cache, conda's notes) stays on that node.
With one home shared by every node, their login shells waited for each other: root's ``~/.bashrc`` here runs
pyenv's initialisation, whose rehash takes a lock file in the home, one node at a time (the session table of
``bench.control_plane`` on 2026-11-23: a round of 16 new sessions took 1.6 s where 16 login shells sharing 2 cores
would take 0.6 s).

Not done -- the home stays shared, as before -- where the cluster's state directory lies inside the home (the
nodes' work directories must stay visible to this machine: its tools read the logs and files there) or a path
holds a character an overlay's options cannot carry.
"""

from __future__ import annotations

import pwd
import shlex
from pathlib import Path

UNSAFE = set(",:= \t\n\\")  # overlay mount options are comma-separated key=value pairs with colon-separated lists


def user_home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def user_group(user: str) -> int:
    """The primary group id of ``user``."""
    return pwd.getpwnam(user).pw_gid


def own_home_steps(home: Path, state_root: Path, node_dir: Path) -> list[str]:
    """Shell steps, run as root in the node's mount namespace before its sshd starts, that give the node its own
    copy-on-write ``home``; [] where the home stays shared (see the module doc). A kernel that refuses the overlay
    leaves the home shared, as before, and says so in the node's ``sshd.log``: the node still starts."""
    home, state_root = Path(home).resolve(), Path(state_root).resolve()
    upper, work, log = node_dir / "home", node_dir / "home.work", node_dir / "sshd.log"
    if home == Path("/") or not home.is_dir() or state_root == home or home in state_root.parents:
        return []
    if any(c in UNSAFE for c in f"{home}{upper}{work}"):
        return []
    h, u, w, lg = (shlex.quote(str(p)) for p in (home, upper, work, log))
    return [
        f"{{ mkdir -p {u} {w} && chown --reference={h} {u} && chmod --reference={h} {u} && "  # the merged home keeps its owner and mode
        f"mount -t overlay multinode-home -o lowerdir={h},upperdir={u},workdir={w} {h}; }} 2>>{lg} || "
        f"echo 'multinode: the home stays shared: the overlay could not be mounted' >>{lg}"
    ]
