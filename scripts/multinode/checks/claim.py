"""A cluster runs one job at a time: a run claims the cluster on its head node before pre-flight, and gives it back
at the end. A second run is refused in one line naming the run in progress and how to wait for it or stop it; one
that is told to wait (``queue``) polls until the cluster is free (SkyPilot queues jobs on a cluster the same way).

The claim is ``flock`` on ``<head workdir>/busy.lock``, taken with ``-n`` (atomic: of two runs started together
exactly one gets it) and held by a command on an SSH channel of its own to the head for the whole run. The kernel
lock lives as long as that command, and the command as long as the channel: an orchestrator that crashes, is
killed or loses its connection gives the cluster back by itself, so there is no stale marker to judge by pid, host
or age. The lock file holds the owner (run id, pid, host, since when) for the refusal line; a clean release empties
it. An owner still written there when the lock is taken is a run whose orchestrator ended without giving the
cluster back: its processes may still run on the nodes (ranks outlive a lost SSH session) and would hold the
rendezvous port, so :meth:`Claim.take` stops them first, and says so in one line.

The run takes no claim where its backend does not reach every node (a SLURM site described by its login node: the
site's scheduler queues jobs, and the login node is shared by its users); the embedded SLURM cluster is claimed like
any local one.
"""

from __future__ import annotations

import os
import shlex
import socket
import time

import paramiko

from multinode.checks.preflight import refuse_unreachable
from multinode.core.errors import PreflightFailed
from multinode.core.inventory import Inventory
from multinode.ssh.runner import RemoteRunner

LOCK = "busy.lock"
BUSY_EXIT = 75  # EX_TEMPFAIL: the cluster is busy
POLL = 2.0  # seconds between a queued run's attempts


def lock_path(inv: Inventory) -> str:
    return f"{inv.workdir_for(inv.head.name)}/{LOCK}"


def holder_command(path: str, owner: str) -> str:
    """The head's side (POSIX sh + flock, whatever the login shell): take the lock or print ``BUSY <owner>`` and exit
    75; once taken print ``TAKEN <what the lock file held>`` (a previous owner that never gave it back, or nothing),
    write ``owner``, and hold the lock until stdin ends; a ``release`` line first empties the file (a clean end)."""
    p, d = shlex.quote(path), shlex.quote(path.rsplit("/", 1)[0])
    script = (
        f"command -v flock >/dev/null || {{ echo NOFLOCK; exit 0; }}; mkdir -p {d} && exec 9<>{p} || exit 70; "
        f"if ! flock -n 9; then i=0; while [ ! -s {p} ] && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; "
        f"echo \"BUSY $(head -n 1 {p})\"; exit {BUSY_EXIT}; fi; "
        f"echo \"TAKEN $(head -n 1 {p})\"; printf '%s\\n' {shlex.quote(owner)} > {p}; echo HELD; "
        f"read -r line; [ \"$line\" = release ] && : > {p}; exit 0"
    )
    return f"exec sh -c {shlex.quote(script)}"


def owner_line(run_id: str) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"{run_id} pid={os.getpid()} host={socket.gethostname()} since={since}"


def parse_owner(owner: str) -> tuple[str, str, str, str]:
    """(run id, pid, host, since) from an owner line; '?' for what it lacks."""
    run_id, _, fields = owner.strip().partition(" ")
    about = dict(field.split("=", 1) for field in fields.split(" ") if "=" in field)
    return run_id or "?", about.get("pid", "?"), about.get("host", "?"), fields.partition("since=")[2] or "?"


def busy_message(cluster: str, owner: str) -> str:
    """One line: who holds the cluster, and how to wait for it, follow it or stop it."""
    run_id, pid, host, since = parse_owner(owner)
    return (f"cluster {cluster!r} is busy: run {run_id} is in progress (orchestrator pid {pid} on {host}, since "
            f"{since}); wait for it with QUEUE=1, follow it with 'make logs RUN={run_id}', or stop it with Ctrl-C in "
            f"its terminal (or 'kill {pid}' on {host})")


class Claim:
    """The run's hold on its cluster (a context manager: :meth:`take` on entry, :meth:`release` on exit)."""

    def __init__(self, runner: RemoteRunner, run_id: str, wait: bool = False, timeout: float = 15.0):
        self.runner, self.run_id, self.wait, self.timeout = runner, run_id, wait, timeout
        self.inv = runner.inventory
        self.channel: paramiko.Channel | None = None

    def __enter__(self) -> "Claim":
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def take(self) -> None:
        """Hold the cluster, or raise :class:`PreflightFailed` (one line) when it is busy and we do not wait, or
        when the head does not answer SSH (pre-flight's own line)."""
        head = self.inv.head.name
        why = self.runner.connect_until([head], time.monotonic() + self.timeout).get(head)
        if why is not None:
            refuse_unreachable(self.inv, {head: why})
        said = False
        while True:
            status, owner = self._attempt()
            if status != "BUSY":
                break
            if not self.wait:
                raise PreflightFailed(busy_message(self.inv.cluster, owner))
            if not said:
                self.runner.say(f"cluster {self.inv.cluster!r} is busy with run {parse_owner(owner)[0]}; "
                                f"queued (QUEUE=1): this run starts when it ends")
                said = True
            time.sleep(POLL)
        if status == "NOFLOCK":
            self.runner.say(f"warning: {self.inv.head.name} has no flock: a second run on this cluster is not refused")
        elif owner:  # its orchestrator ended without giving the cluster back
            stale, pid, host, _ = parse_owner(owner)
            self.runner.say(f"run {stale} ended without giving the cluster back (its orchestrator, pid {pid} on {host}, "
                            f"is gone); stopping whatever is left of it on every node")
            self.runner.stop_all(stale)

    def _attempt(self) -> tuple[str, str]:
        """One try: ("TAKEN" | "BUSY" | "NOFLOCK", the owner the head named)."""
        head = self.inv.head.name
        channel = self.runner.connection(head).transport.open_session(timeout=self.timeout)
        channel.settimeout(self.timeout)
        channel.exec_command(holder_command(lock_path(self.inv), owner_line(self.run_id)))
        try:
            reply = _reply(channel)
        except OSError as err:  # socket.timeout included
            channel.close()
            raise PreflightFailed(f"{head}: could not claim the cluster ({err or 'no answer'}); "
                                  f"check the node with 'make status'") from None
        status, _, owner = reply.partition("\n")[0].partition(" ")
        if status == "TAKEN":
            self.channel = channel
            return status, owner.strip()
        channel.close()
        if status not in ("BUSY", "NOFLOCK"):
            raise PreflightFailed(f"{head}: could not claim the cluster ({reply.strip() or 'no answer'}); "
                                  f"check the node with 'make status'")
        return status, owner.strip()

    def release(self) -> None:
        """Give the cluster back: the lock file emptied, the holder ended (waited for, so nothing of it is left)."""
        channel, self.channel = self.channel, None
        if channel is None:
            return
        try:
            channel.sendall(b"release\n")
            channel.shutdown_write()
            channel.status_event.wait(self.timeout)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the connection is gone: so is the holder, and the next run stops what is left of this one
        finally:
            channel.close()


def _reply(channel: paramiko.Channel) -> str:
    """The holder's answer: its first line, and for TAKEN everything up to HELD (the owner is written then)."""
    reply = b""
    while b"\n" not in reply or (reply.startswith(b"TAKEN") and b"HELD\n" not in reply):
        chunk = channel.recv(4096)
        if not chunk:
            break
        reply += chunk
    return reply.decode(errors="replace")
