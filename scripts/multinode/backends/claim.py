"""A cluster runs one job at a time: a run claims the cluster on its head node before pre-flight, and gives it back
at the end. A second run is refused in one line naming the run in progress and how to wait for it or stop it; one
that is told to wait (``queue``) polls until the cluster is free (SkyPilot queues jobs on a cluster the same way).

The claim is ``flock`` on ``<head workdir>/busy.lock``, taken with ``-n`` (atomic: of two runs started together
exactly one gets it) in the head's shell (the run's first command there) and held for the whole run by a process
it leaves behind, which ends with the run's SSH connection to the head (``tail --pid`` of the node's sshd process
that serves the connection). The kernel lock lives as long as that process: an orchestrator that crashes, is
killed or loses its connection gives the cluster back by itself, so there is no stale marker to judge by pid, host
or age. (It was held by a command on an SSH session of its own: that session's login shell was the head's second
one, and where the rc files take a lock -- pyenv's rehash, on the machine of docs/benchmarks.md -- the two took
turns, on the critical path of every run.) The lock file holds the owner (run id, pid, host, since when) for the
refusal line; a clean release empties it. An owner still written there when the lock is taken is a run whose orchestrator ended without giving the
cluster back: its processes may still run on the nodes (ranks outlive a lost SSH session) and would hold the
rendezvous port, so :meth:`Claim.take` stops them first, and says so in one line.

A run holds its claim for all its attempts (RECOVER); where the head itself is replaced between two, the run takes
the claim again on the new head. The claim is the backend's reach's (:mod:`multinode.backends.reach`): none where
the run reaches only a SLURM site's login node (the site's scheduler queues jobs, and the login node is shared by
its users); the embedded SLURM cluster is claimed like any local one.
"""

from __future__ import annotations

import os
import shlex
import socket
import time

from multinode.checks.preflight import refuse_unreachable
from multinode.core.errors import PreflightFailed
from multinode.core.inventory import Inventory
from multinode.ssh.runner import CommandResult, RemoteRunner

LOCK = "busy.lock"
BUSY_EXIT = 3  # the head's answer when another run holds the lock (between us and the head only)
POLL = 2.0  # seconds between a queued run's attempts


def lock_path(inv: Inventory) -> str:
    return f"{inv.workdir_for(inv.head.name)}/{LOCK}"


def holder_command(path: str, owner: str) -> str:
    """The head's side (POSIX sh + flock + GNU tail, run in the node's shell): take the lock or print ``BUSY
    <owner>`` and exit 75; once taken print ``TAKEN <what the lock file held>`` (a previous owner that never gave it
    back, or nothing), write ``owner``, and leave a holder with the lock that lives until the sshd process serving
    this SSH connection ends (or :meth:`Claim.release` stops it): ``HELD <its pid>``. ``NOFLOCK``: the head lacks
    flock or GNU tail, or runs no sshd (nothing to tie the lock to): no claim."""
    p, d = shlex.quote(path), shlex.quote(path.rsplit("/", 1)[0])
    script = (
        "command -v flock >/dev/null && tail --pid=$$ -s 0.2 -n 0 /dev/null 2>/dev/null || { echo NOFLOCK; exit 0; }\n"
        # The sshd process that serves this connection: the nearest ancestor named sshd*.
        "s=; p=$PPID\n"
        "while [ \"$p\" -gt 1 ] && read -r c < /proc/$p/comm; do case $c in sshd*) s=$p; break;; esac; "
        "read -r _ _ _ p _ < /proc/$p/stat || break; done\n"
        "[ -n \"$s\" ] || { echo NOFLOCK; exit 0; }\n"
        f"{{ [ -d {d} ] || mkdir -p {d}; }} && exec 9<>{p} || exit 70\n"
        f"if ! flock -n 9; then i=0; while [ ! -s {p} ] && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; "
        f"echo \"BUSY $(head -n 1 {p})\"; exit {BUSY_EXIT}; fi\n"
        f"IFS= read -r was < {p} || was=; echo \"TAKEN $was\"; printf '%s\\n' {shlex.quote(owner)} > {p}\n"
        "( exec tail --pid=$s -s 0.2 -f /dev/null ) </dev/null >/dev/null 2>&1 &\n"
        "echo \"HELD $!\"\n"
    )
    return f"exec sh -c {shlex.quote(script)}"


def release_command(path: str, run_id: str, holder: int) -> str:
    """Empty the lock file (while the holder still holds it for ``run_id``) and stop the holder, waiting for it
    (an ended holder is a zombie until whoever adopted it reaps it: its lock is gone already)."""
    p = shlex.quote(path)
    alive = f"read -r _ c z _ 2>/dev/null < /proc/{holder}/stat && [ \"$c\" = '(tail)' ] && [ \"$z\" != Z ]"
    return (f"if {alive} && read -r was _ < {p} && [ \"$was\" = {shlex.quote(run_id)} ]; then : > {p}; fi; "
            f"{alive} && kill {holder}; i=0; while {alive} && [ $i -lt 50 ]; do sleep 0.02; i=$((i+1)); done; true")


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
        self.holder: int | None = None  # the head's process that holds the lock (HELD <pid>)

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
            self.runner.say(f"warning: {self.inv.head.name} has no flock or GNU tail (or no sshd to tie the claim to): "
                            f"a second run on this cluster is not refused")
        elif owner:  # its orchestrator ended without giving the cluster back
            stale, pid, host, _ = parse_owner(owner)
            self.runner.say(f"run {stale} ended without giving the cluster back (its orchestrator, pid {pid} on {host}, "
                            f"is gone); stopping whatever is left of it on every node")
            self.runner.stop_all(stale)

    def _attempt(self) -> tuple[str, str]:
        """One try: ("TAKEN" | "BUSY" | "NOFLOCK", the owner the head named)."""
        head = self.inv.head.name
        res = self.runner.run_on(head, holder_command(lock_path(self.inv), owner_line(self.run_id)), timeout=self.timeout)
        status, _, owner = res.stdout.partition("\n")[0].partition(" ")
        if status == "TAKEN":
            held = res.stdout.rpartition("HELD ")[2].split()
            if res.exit_code != 0 or not held or not held[0].isdigit():
                raise PreflightFailed(f"{head}: could not claim the cluster ({_said(res)}); check the node with 'make status'")
            self.holder = int(held[0])
            return status, owner.strip()
        if status not in ("BUSY", "NOFLOCK"):
            raise PreflightFailed(f"{head}: could not claim the cluster ({_said(res)}); check the node with 'make status'")
        return status, owner.strip()

    def release(self) -> None:
        """Give the cluster back: the lock file emptied, the holder ended (waited for, so nothing of it is left)."""
        holder, self.holder = self.holder, None
        if holder is None or self.runner.inventory.head.name != self.inv.head.name:
            return  # never taken, or its head is gone (lost, and the run went on without it): so is the holder
        # Where the connection is gone, so is the holder, and the next run stops what is left of this one.
        self.runner.run_on(self.inv.head.name, release_command(lock_path(self.inv), self.run_id, holder),
                           timeout=self.timeout)


def _said(res: CommandResult) -> str:
    """What the head answered (or why it did not), in one line."""
    text = (res.error or res.stdout.strip() or res.stderr.strip() or f"exit {res.exit_code}").strip()
    return " ".join(text.splitlines()[-2:]) or "no answer"
