"""The connections to a cluster's nodes and each node's persistent shells: opened lazily (or all at once in the
background, :meth:`NodePool.prewarm`), pooled, and closed together. :class:`multinode.ssh.runner.RemoteRunner` runs
commands through them.

Contract:

* Every connection is :func:`multinode.ssh.connect.open_connection`'s: the cluster key only, the cluster's
  pinned host keys only (an unknown or changed host key is refused, never added).
* Every command runs in a persistent shell of the node (:mod:`multinode.ssh.shell`): one SSH session per node and
  run, where a session per command made the node start a login shell (and its rc files) each time. Shells are
  pooled per node; a command that finds every shell of its node busy (e.g. a stop while the job runs) opens
  another. Connecting starts each node's first shell at once, so its login shell runs while the other nodes connect.
* Fabric's ``ThreadingGroup`` has no join timeout and no cancel, so parallelism here is plain daemon threads joined
  with deadlines: a node that stops answering can delay us by at most the deadline, never hang us.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import Any, TextIO

import paramiko
from fabric import Config, Connection

from multinode.core.inventory import Inventory, Node
from multinode.ssh.shell import NodeShell
from multinode.ssh.connect import describe_ssh_error, fabric_config, open_connection, refused

log = logging.getLogger(__name__)

CONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0)  # seconds between connection attempts to a node that does not answer
SHELL_END_WAIT = 2.0  # at close, how long the nodes have to report their shells ended


def _close(shells: list[NodeShell], conn: Connection | None) -> None:
    for shell in shells:
        shell.close()
    if conn is not None:
        conn.close()


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


class NodePool:
    """Connections to the nodes of one inventory and their shells, opened lazily and closed on exit."""

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

    def __enter__(self) -> "NodePool":
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

    def forget_host_keys(self) -> None:
        """Read known_hosts again at the next connection (a replaced node's new key was written there)."""
        with self._lock:
            self._known_hosts = None

    def drop(self, name: str) -> None:
        """Forget a node's connection, e.g. after it stopped answering, and close it and its shells on a thread: a
        close sends to the node (paramiko's channel close), which must not hold the caller when it does not answer."""
        with self._lock:
            conn = self._connections.pop(name, None)
            self._shells.pop(name, None)
            shells = self._open.pop(name, [])
        if shells or conn is not None:
            threading.Thread(target=_close, args=(shells, conn), name=f"mn-drop-{name}", daemon=True).start()

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
