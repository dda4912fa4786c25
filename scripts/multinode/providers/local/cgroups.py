"""The host's cgroup filesystems, mounted again inside a local node's namespace.

``ip netns exec`` mounts a fresh sysfs on /sys, which hides /sys/fs/cgroup; container runtimes
(runc, crun) and slurmd's cgroup plugin refuse to start without it. Used by the nodes' sshd (the
docker runtime: :mod:`multinode.providers.local.sshd`) and by the SLURM daemons
(:mod:`multinode.providers.local.slurm`).
"""

from __future__ import annotations

import shlex

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
