"""The one runner for everything that happens on nodes: Fabric connections in parallel, with pinned host
keys, each node's persistent shells, short commands and files, the stop by run id. A job on every node at once
is :class:`multinode.ssh.job.JobRun`'s (whole-line streaming, deadlines, gang-stop, rejoin), built on this runner.

Contract:

* Every connection is :func:`multinode.ssh.connect.open_connection`'s: the cluster key only, the cluster's
  pinned host keys only (an unknown or changed host key is refused, never added).
* Commands run without a pty: a lost connection does not kill the remote job (it is stopped
  explicitly, by run id), and stdout/stderr stay separate streams.
* Every command -- pre-flight, sync, checks, the job, the sweep -- runs in a persistent shell of the node
  (:mod:`multinode.ssh.shell`): one SSH session per node and run, where a session per command made the node
  start a login shell (and its rc files) each time. Shells are pooled per node; a command that finds every
  shell of its node busy (e.g. a stop while the job runs) opens another. Connecting starts each node's first
  shell at once, so its login shell runs while the other nodes connect.
* :meth:`RemoteRunner.stop_all` stops every process whose environment carries ``MULTINODE_RUN_ID=<run id>``
  (torchrun starts workers in their own session: a process-tree or process-group kill would miss them).
* Fabric's ``ThreadingGroup`` has no join timeout and no cancel, so parallelism here is plain
  daemon threads joined with deadlines: a node that stops answering can delay us by at most the
  deadline, never hang us.
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import paramiko
from fabric import Config, Connection

from multinode.core.errors import NodeError
from multinode.core.inventory import Inventory, Node
from multinode.ssh.shell import NodeShell
from multinode.ssh.connect import describe_ssh_error, fabric_config, open_connection, refused

log = logging.getLogger(__name__)

STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL on a node
CONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0)  # seconds between connection attempts to a node that does not answer
SHELL_END_WAIT = 2.0  # at close, how long the nodes have to report their shells ended

# Stop every process of one run on this node: match the exact environment entry, restricted to
# this node's network namespace (simulated nodes share one /proc). TERM, wait, KILL, report.
# list(): one grep and, where it matched, one stat for every match's namespace (a readlink per match made a
# sweep on a simulated node cost a process per live process of every other node).
STOP_SCRIPT = r"""
tag="MULTINODE_RUN_ID=$1"; grace_ticks=$2
self_ns=$(stat -L -c %i /proc/self/ns/net)
list() {
  files=$(grep -lzxF "$tag" /proc/[0-9]*/environ 2>/dev/null); [ -n "$files" ] || return 0
  for f in $files; do echo "${f%/environ}/ns/net"; done | xargs -r stat -L -c '%i %n' 2>/dev/null |
    while read -r ns path; do [ "$ns" = "$self_ns" ] && { p=${path#/proc/}; echo "${p%/ns/net}"; }; done
}
pids=$(list)
[ -z "$pids" ] && { echo "stopped 0"; exit 0; }
n=$(echo $pids | wc -w)
kill -TERM $pids 2>/dev/null
kill -CONT $pids 2>/dev/null  # a stopped (SIGSTOPped) process acts on the TERM only once continued
i=0
while [ $i -lt $grace_ticks ]; do sleep 0.1; pids=$(list); [ -z "$pids" ] && break; i=$((i+1)); done
[ -n "$pids" ] && kill -KILL $pids 2>/dev/null && sleep 0.2
left=$(list)
echo "stopped $n${left:+ left $left}"
"""


@dataclass
class CommandResult:
    """A short command run on one node with its output captured."""

    node: str
    exit_code: int | None  # None: no answer (SSH failed or timed out)
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _parallel(fn: Callable[[str], Any], names: Iterable[str], timeout: float | None) -> dict[str, tuple[bool, Any]]:
    """Run ``fn(name)`` for every name at once; {name: (finished, value or exception)} after ``timeout``."""
    results: dict[str, tuple[bool, Any]] = {}
    threads = []
    for name in names:
        def target(name: str = name) -> None:
            try:
                results[name] = (True, fn(name))
            except Exception as err:  # reported per node by the caller
                results[name] = (True, err)
        thread = threading.Thread(target=target, name=f"mn-{name}", daemon=True)
        thread.start()
        threads.append((name, thread))
    end = None if timeout is None else time.monotonic() + timeout
    for name, thread in threads:
        thread.join(None if end is None else max(0.0, end - time.monotonic()))
    return {name: results.get(name, (False, TimeoutError(f"no answer within {timeout:.0f} s"))) for name, _ in threads}


class RemoteRunner:
    """Connections to the nodes of one inventory, opened lazily and closed on exit."""

    def __init__(self, inventory: Inventory, out: TextIO | None = None, connect_timeout: float = 5.0):
        self.inventory = inventory
        self.out = out if out is not None else sys.stdout
        self.connect_timeout = connect_timeout
        self._connections: dict[str, Connection] = {}
        self._shells: dict[str, list[NodeShell]] = {}  # idle shells per node (multinode.ssh.shell)
        self._open: dict[str, list[NodeShell]] = {}  # every shell per node, idle or busy, until closed
        self._lock = threading.Lock()
        self._config: Config | None = None
        self._known_hosts: paramiko.HostKeys | None = None
        self._warming: dict[str, Future] = {}  # connections prewarm() started, not yet awaited: their outcome
        self.print_lock = threading.Lock()

    def __enter__(self) -> "RemoteRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every shell and wait (SHELL_END_WAIT at most) for the nodes to report them gone -- a shell whose
        login shell was still reading its rc files would otherwise outlive us for a moment --, then disconnect."""
        with self._lock:
            warming = list(self._warming.values())
            self._warming.clear()
        wait(warming, self.connect_timeout * 2)  # a connection still being made is closed with the others
        with self._lock:
            shells = [shell for opened in self._open.values() for shell in opened]
            self._open.clear()
            self._shells.clear()
        for shell in shells:
            shell.end()
        end = time.monotonic() + SHELL_END_WAIT
        while any(not shell.ended() for shell in shells) and time.monotonic() < end:
            time.sleep(0.02)
        for shell in shells:
            shell.close()
        for conn in list(self._connections.values()):
            try:
                conn.close()
            except Exception:  # closing a dead transport may raise; nothing to do about it
                pass
        self._connections.clear()

    def say(self, message: str) -> None:
        with self.print_lock:
            print(f"[multinode] {message}", file=self.out, flush=True)

    # --- connections ------------------------------------------------------------

    def _node(self, name: str) -> Node:
        return self.inventory.node(name)

    def connection(self, name: str) -> Connection:
        """An open connection to a node (pinned host key, cluster key only)."""
        with self._lock:
            conn = self._connections.get(name)
        if conn is not None and conn.is_connected:
            return conn
        conn = open_connection(self._node(name), self.inventory.ssh_key, self._pinned_keys(), self._fabric_config(),
                               self.connect_timeout)
        with self._lock:
            self._connections[name] = conn
        return conn

    def _fabric_config(self) -> Config:
        """One Fabric config for every connection (building one reads and merges its config files: per node at 64
        nodes that was a measurable part of connecting)."""
        with self._lock:
            if self._config is None:
                self._config = fabric_config()
            return self._config

    def _pinned_keys(self) -> paramiko.HostKeys:
        """The cluster's known_hosts, parsed once (each client parsing all N lines made connecting O(N^2))."""
        with self._lock:
            if self._known_hosts is None:
                self._known_hosts = paramiko.HostKeys(self.inventory.known_hosts)
            return self._known_hosts

    def drop(self, name: str) -> None:
        """Forget (and close) a node's connection, e.g. after it stopped answering."""
        with self._lock:
            conn = self._connections.pop(name, None)
            self._shells.pop(name, None)
            shells = self._open.pop(name, [])
        for shell in shells:
            shell.close()
        if conn is not None:
            threading.Thread(target=conn.close, daemon=True).start()

    def connect_all(self, names: Iterable[str] | None = None, timeout: float | None = None) -> dict[str, str | None]:
        """Open every connection at once; {node: None if connected else why not}."""
        names = list(names or (n.name for n in self.inventory.nodes))
        answers = _parallel(self._connect_warm, names, timeout or self.connect_timeout + 5)
        return {
            name: None if done and not isinstance(value, BaseException) else describe_ssh_error(value)
            for name, (done, value) in answers.items()
        }

    def prewarm(self) -> None:
        """Start connecting to every node (and its first shell) in the background, and return at once: the nodes'
        login shells run while the caller still imports and plans. :meth:`connect_until` then waits for these
        attempts and retries and words what failed; nothing is reported here."""
        for node in self.inventory.nodes:
            future: Future = Future()
            with self._lock:
                self._warming[node.name] = future
            threading.Thread(target=self._prewarm_one, args=(node.name, future), name=f"mn-warm-{node.name}",
                             daemon=True).start()

    def _prewarm_one(self, name: str, future: Future) -> None:
        try:
            self._connect_and_open(name)
        except Exception as err:  # the first attempt's failure, for connect_until() to word and retry
            future.set_exception(err)
        else:
            future.set_result(None)

    def _connect_warm(self, name: str) -> None:
        """Connect, and start the node's first shell: its login shell starts while the other nodes connect. Where
        :meth:`prewarm` made this attempt already, its outcome (its failure raised again)."""
        with self._lock:
            warming = self._warming.pop(name, None)
        if warming is not None:
            warming.result()  # bounded by the connect and shell-open timeouts
        self._connect_and_open(name)

    def _connect_and_open(self, name: str) -> None:
        self.connection(name)
        with self._lock:
            if self._shells.get(name):
                return
        self._release(name, self._open_shell(name, self.connect_timeout))

    # --- shells ---------------------------------------------------------------------

    def _open_shell(self, name: str, open_timeout: float) -> NodeShell:
        shell = NodeShell(self.connection(name).transport, open_timeout)
        with self._lock:
            self._open.setdefault(name, []).append(shell)
        return shell

    def _acquire(self, name: str, open_timeout: float | None = None) -> NodeShell:
        with self._lock:
            idle = self._shells.get(name)
            if idle:
                return idle.pop()
        return self._open_shell(name, open_timeout or self.connect_timeout)

    def _release(self, name: str, shell: NodeShell) -> None:
        if shell.broken:
            with self._lock:
                if shell in self._open.get(name, []):
                    self._open[name].remove(shell)
            return
        with self._lock:
            if self._connections.get(name) is not None:
                self._shells.setdefault(name, []).append(shell)
                return
        shell.close()  # the node was dropped meanwhile

    def execute(self, name: str, command: str, data: bytes = b"", timeout: float | None = 60.0,
                open_timeout: float | None = None, out=None, err=None) -> tuple[int, bytes, bytes]:
        """``command`` in one of the node's shells (see :meth:`NodeShell.execute`); an idle one, else a new one.
        ``open_timeout``: how long the node has to acknowledge the command (an unreachable node fails that fast)."""
        shell = self._acquire(name, open_timeout)
        try:
            return shell.execute(command, data, timeout, out=out, err=err, answer_timeout=open_timeout)
        finally:
            self._release(name, shell)

    def connect_until(self, names: Iterable[str], end: float) -> dict[str, str]:
        """Connect to every node, retrying the ones that fail (with backoff) until ``time.monotonic()``
        reaches ``end``; at least one attempt each. {node: why} of those that still fail, a refused host
        key or login key (never retried: waiting cannot fix it) first; empty when every node answered."""
        missing, attempt = list(names), 0
        while True:
            answers = self.connect_all(missing, timeout=max(1.0, min(self.connect_timeout + 2, end - time.monotonic())))
            failed = {name: why for name, why in answers.items() if why}
            fatal = {name: why for name, why in failed.items() if refused(why)}
            pause = CONNECT_BACKOFF[min(attempt, len(CONNECT_BACKOFF) - 1)]
            if fatal or not failed or time.monotonic() + pause > end:
                return {**fatal, **failed}
            time.sleep(pause)
            attempt += 1
            missing = list(failed)

    def parallel(self, fn: Callable[[str], Any], names: Iterable[str], timeout: float) -> dict[str, BaseException | None]:
        """``fn(node)`` on every node at once; {node: None or the exception it raised / a timeout}."""
        answers = _parallel(fn, names, timeout)
        return {name: value if isinstance(value, BaseException) else None for name, (done, value) in answers.items()}

    # --- short commands ------------------------------------------------------------

    def run_on(self, name: str, command: str, timeout: float | None = 30.0) -> CommandResult:
        try:
            code, out, err = self.execute(name, command, timeout=timeout)
        except Exception as error:  # SSH failure or a timeout: the node did not answer
            return CommandResult(name, None, error=describe_ssh_error(error))
        return CommandResult(name, code, out.decode(errors="replace"), err.decode(errors="replace"))

    def run_each(self, commands: dict[str, str], timeout: float = 30.0) -> dict[str, CommandResult]:
        """A (different) short command on each node, all at once, output captured."""
        answers = _parallel(lambda name: self.run_on(name, commands[name], timeout), commands, timeout + 5)
        return {
            name: value if done else CommandResult(name, None, error=str(value))
            for name, (done, value) in answers.items()
        }

    def run_all(self, command: str, names: Iterable[str] | None = None, timeout: float = 30.0) -> dict[str, CommandResult]:
        names = list(names or (n.name for n in self.inventory.nodes))
        return self.run_each({name: command for name in names}, timeout)

    # --- files ------------------------------------------------------------------------

    def run_with_input(self, name: str, command: str, data: bytes = b"", timeout: float = 60.0,
                       open_timeout: float | None = None) -> bytes:
        """Run ``command`` on a node with ``data`` on its stdin; its stdout, or NodeError on a non-zero exit.
        In a node shell: no SFTP subsystem needed."""
        code, out, err = self.execute(name, command, data, timeout=timeout, open_timeout=open_timeout)
        if code != 0:
            text = err.decode(errors="replace").strip()
            raise NodeError(name, command, code, text or f"{command!r} failed")
        return out

    def put_bytes(self, name: str, path: str, data: bytes, mode: int | None = None) -> None:
        """Write a file on a node (parents created, replaced atomically)."""
        quoted, tmp = shlex.quote(path), shlex.quote(f"{path}.tmp{threading.get_ident()}")
        chmod = f" && chmod {mode:o} {tmp}" if mode is not None else ""
        self.run_with_input(name, f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cat > {tmp}{chmod} && mv -f {tmp} {quoted}", data)

    def get_file(self, name: str, remote: str, local: Path) -> None:
        """Copy a node's file to the control machine; OSError if it does not exist."""
        try:
            data = self.run_with_input(name, f"cat {shlex.quote(remote)}")
        except NodeError as err:
            raise OSError(f"{name}: cannot read {remote}: {err.message}") from None
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)

    # --- jobs ---------------------------------------------------------------------------

    def stop_all(self, run_id: str, extra_stop: Callable[[str], str | None] | None = None,
                 names: Iterable[str] | None = None) -> dict[str, CommandResult]:
        """Stop every process tagged with ``run_id`` on every node, or on ``names`` (and the run's containers)."""
        names = [n.name for n in self.inventory.nodes] if names is None else list(names)
        commands = {}
        for name in names:
            line = f"sh -c {shlex.quote(STOP_SCRIPT)} stop {shlex.quote(run_id)} {int(STOP_GRACE * 10)}"
            extra = extra_stop(name) if extra_stop else None
            commands[name] = f"{extra}; {line}" if extra else line
        def stop(name: str) -> CommandResult:
            # A short channel-open timeout: a node that cannot open a channel in 3 s is unreachable.
            try:
                out = self.run_with_input(name, commands[name], timeout=STOP_GRACE + 5, open_timeout=3)
            except Exception as err:  # no answer, or the stop itself failed
                return CommandResult(name, None, error=describe_ssh_error(err))
            return CommandResult(name, 0, out.decode(errors="replace"))

        answers = _parallel(stop, commands, STOP_GRACE + 8)
        results = {name: value if done and isinstance(value, CommandResult) else CommandResult(name, None, error=str(value))
                   for name, (done, value) in answers.items()}
        for name, res in results.items():
            if not res.ok:
                log.warning("%s: could not stop run %s: %s", name, run_id, res.error or res.stderr.strip())
            elif "left" in res.stdout:
                log.warning("%s: processes of run %s survived SIGKILL: %s", name, run_id, res.stdout.strip())
        return results
