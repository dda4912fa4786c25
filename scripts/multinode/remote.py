"""The one runner for everything that happens on nodes: Fabric connections, in parallel, with
pinned host keys, whole-line streaming, deadlines and gang-stop.

Contract:

* Every connection uses the cluster key only and the cluster's ``known_hosts`` only, with
  Paramiko's ``RejectPolicy``: an unknown or changed host key is refused, never added.
* Commands run with ``pty=False``: a lost connection does not kill the remote job (it is stopped
  explicitly, by run id), and stdout/stderr stay separate streams.
* Every command -- pre-flight, sync, checks, the job, the sweep -- runs in a persistent shell of the node
  (:mod:`multinode.nodeshell`): one SSH session per node and run, where a session per command made the node
  start a login shell (and its rc files) each time. Shells are pooled per node; a command that finds every
  shell of its node busy (e.g. a stop while the job runs) opens another.
* Output is re-assembled into whole lines before it is written, so lines of different nodes
  never interleave mid-line; each line goes to ``<log_dir>/<node>.log`` and, prefixed
  ``[node-i]``, to the console.
* :meth:`RemoteRunner.run` starts a job on every node at once. The first node that exits non-zero
  or loses its SSH session makes the runner stop the job on every node (processes whose
  environment carries ``MULTINODE_RUN_ID=<run id>``: torchrun starts workers in their own
  session, so a process-tree or process-group kill would miss them) and raise
  :class:`~multinode.errors.JobFailed`. A deadline, a stall (``stalled``) and Ctrl-C do the same; before
  the stop of a failure, deadline or stall, the caller's ``before_stop`` hook may look at the live ranks.
* Elastic jobs (``rejoin``): a node whose session is lost or whose launcher is killed by a signal
  is not a failure while it has restarts left. The runner stops what is left of the run on it,
  waits for it to answer SSH again (a rebooted or replaced node), lets the caller prepare it
  (code sync) and starts its command again; torchrun's rendezvous takes it back in. A launcher
  that exits with its own error code (e.g. torchrun after its restarts ran out) is a failure.
* Fabric's ``ThreadingGroup`` has no join timeout and no cancel, so parallelism here is plain
  daemon threads joined with deadlines: a node that stops answering can delay us by at most the
  deadline, never hang us.
"""

from __future__ import annotations

import logging
import posixpath
import queue
import shlex
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import paramiko
from fabric import Config, Connection

from multinode.errors import Interrupted, JobFailed, NodeError
from multinode.inventory import Inventory, Node
from multinode.nodeshell import NodeShell, NoAnswer, ShellBroken, TextSink

log = logging.getLogger(__name__)

TAIL_LINES = 20
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL on a node
LOST_GRACE = 15.0  # after a stop, how long a node's session may take to end before we drop it
CONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0)  # seconds between connection attempts to a node that does not answer

# Stop every process of one run on this node: match the exact environment entry, restricted to
# this node's network namespace (simulated nodes share one /proc). TERM, wait, KILL, report.
STOP_SCRIPT = r"""
tag="MULTINODE_RUN_ID=$1"; grace_ticks=$2
self_ns=$(readlink /proc/self/ns/net)
list() {
  for f in $(grep -lzxF "$tag" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    [ "$(readlink /proc/$p/ns/net 2>/dev/null)" = "$self_ns" ] && echo "$p"
  done
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


@dataclass
class NodeResult:
    """How one node's part of a job ended."""

    node: str
    exit_code: int | None = None  # None: lost (SSH died) or never finished
    started: float = 0.0
    finished: float | None = None
    error: NodeError | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lost: bool = False  # the SSH session died (node down or cut off), as opposed to an exit code
    relaunches: int = 0  # times the runner started this node's command again (elastic jobs)

    @property
    def killed(self) -> bool:
        """Lost, or the launcher died by a signal (SSH reports -1; a shell, 128 + signal)."""
        return self.lost or self.exit_code is None or self.exit_code < 0 or self.exit_code >= 128


@dataclass(frozen=True)
class Rejoin:
    """Elastic policy for :meth:`RemoteRunner.run`: which nodes may be started again, how often, how."""

    budget: int  # relaunches allowed per node
    wait: float  # seconds a lost node has to answer SSH again
    prepare: Callable[[str], None] = lambda name: None  # e.g. sync the code again (a replaced node has none)
    exclude: tuple[str, ...] = ()  # nodes whose loss ends the job (the head: it hosts the rendezvous)


Relabel = Callable[[str, str], tuple[str, str]]
"""(node the line arrived from, line) -> (node it belongs to, line to show); e.g. mpirun's rank tags."""


class LineSink:
    """File-like target for Fabric's out_stream/err_stream: emits whole lines only."""

    def __init__(self, node: str, lock: threading.Lock, log_file: TextIO | None, out: TextIO | None, tail: deque,
                 relabel: Relabel | None = None):
        self.node, self.lock, self.log_file, self.out, self.tail = node, lock, log_file, out, tail
        self.relabel = relabel or (lambda node, line: (node, line))
        self.buffer = ""

    def write(self, data: str) -> int:
        self.buffer += data
        if "\n" in self.buffer:
            *lines, self.buffer = self.buffer.split("\n")
            self._emit(lines)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buffer:
            self._emit([self.buffer])
            self.buffer = ""

    def _emit(self, lines: list[str]) -> None:
        lines = [line.rstrip("\r") for line in lines]
        self.tail.extend(lines)
        with self.lock:
            if self.log_file:
                self.log_file.write("".join(f"{line}\n" for line in lines))
                self.log_file.flush()
            if self.out:
                shown = (self.relabel(self.node, line) for line in lines)
                self.out.write("".join(f"[{node}] {line}\n" for node, line in shown))
                self.out.flush()


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


def describe_ssh_error(err: BaseException) -> str:
    if isinstance(err, paramiko.BadHostKeyException):
        return "its host key does not match the pinned one in known_hosts (refused; was the node replaced?)"
    if isinstance(err, paramiko.SSHException) and "not found in known_hosts" in str(err):
        return "its host key is not in the cluster's known_hosts (refused)"
    if isinstance(err, paramiko.AuthenticationException):
        return "the cluster key was refused"
    return f"{type(err).__name__}: {err}".strip().rstrip(":")


class StopRequested(Exception):
    """A stop signal arrived while a job ran (see :class:`StopSignals`)."""


class StopSignals:
    """While a job runs, Ctrl-C, SIGTERM and SIGHUP (a closed terminal) only record themselves; the
    runner's watch loop reads that between events and stops the job on every node, as Ctrl-C does.
    A KeyboardInterrupt raised at an arbitrary point could leave the event queue's or the output's
    lock held and hang the gang-stop that follows; a default SIGTERM would leave the job running on
    every node. A second signal does not cut the gang-stop short (LOST_GRACE bounds it). Outside the
    main thread signals cannot be caught, and nothing changes."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._record) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class RemoteRunner:
    """Connections to the nodes of one inventory, opened lazily and closed on exit."""

    def __init__(self, inventory: Inventory, out: TextIO | None = None, connect_timeout: float = 5.0):
        self.inventory = inventory
        self.out = out if out is not None else sys.stdout
        self.connect_timeout = connect_timeout
        self._connections: dict[str, Connection] = {}
        self._shells: dict[str, list[NodeShell]] = {}  # idle shells per node (multinode.nodeshell)
        self._lock = threading.Lock()
        self._print_lock = threading.Lock()

    def __enter__(self) -> "RemoteRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            shells = [shell for idle in self._shells.values() for shell in idle]
            self._shells.clear()
        for shell in shells:
            shell.close()
        for conn in list(self._connections.values()):
            try:
                conn.close()
            except Exception:  # closing a dead transport may raise; nothing to do about it
                pass
        self._connections.clear()

    def say(self, message: str) -> None:
        with self._print_lock:
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
        node = self._node(name)
        conn = Connection(
            host=node.ssh_host,
            user=node.ssh_user,
            port=node.ssh_port,
            connect_timeout=self.connect_timeout,
            config=Config(overrides={"load_ssh_configs": False}),
            connect_kwargs={
                "key_filename": [self.inventory.ssh_key],
                "look_for_keys": False,
                "allow_agent": False,
                "banner_timeout": self.connect_timeout,
                "auth_timeout": self.connect_timeout,
            },
        )
        # Fabric's client trusts ~/.ssh/known_hosts and auto-adds unknown keys; ours trusts the
        # cluster's pinned keys only.
        client = paramiko.SSHClient()
        client.load_host_keys(self.inventory.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        conn.client = client
        conn.open()
        conn.transport.set_keepalive(5)
        with self._lock:
            self._connections[name] = conn
        return conn

    def drop(self, name: str) -> None:
        """Forget (and close) a node's connection, e.g. after it stopped answering."""
        with self._lock:
            conn = self._connections.pop(name, None)
            shells = self._shells.pop(name, [])
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

    def _connect_warm(self, name: str) -> None:
        """Connect, and start the node's first shell: its login shell starts while the other nodes connect."""
        self.connection(name)
        with self._lock:
            if self._shells.get(name):
                return
        self._release(name, NodeShell(self.connection(name).transport, self.connect_timeout))

    # --- shells ---------------------------------------------------------------------

    def _acquire(self, name: str, open_timeout: float | None = None) -> NodeShell:
        with self._lock:
            idle = self._shells.get(name)
            if idle:
                return idle.pop()
        return NodeShell(self.connection(name).transport, open_timeout or self.connect_timeout)

    def _release(self, name: str, shell: NodeShell) -> None:
        if shell.broken:
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
            fatal = {name: why for name, why in failed.items() if "host key" in why or "key was refused" in why}
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

    def _exec_raw(self, name: str, command: str, data: bytes = b"", timeout: float = 60.0,
                  open_timeout: float | None = None) -> bytes:
        """Run ``command`` with ``data`` on stdin; return stdout. In a node shell: no SFTP subsystem needed."""
        code, out, err = self.execute(name, command, data, timeout=timeout, open_timeout=open_timeout)
        if code != 0:
            text = err.decode(errors="replace").strip()
            raise NodeError(name, command, code, text or f"{command!r} failed")
        return out

    def run_with_input(self, name: str, command: str, data: bytes, timeout: float = 60.0) -> bytes:
        """Run ``command`` on a node with ``data`` on its stdin; its stdout, or NodeError on a non-zero exit."""
        return self._exec_raw(name, command, data, timeout)

    def put_bytes(self, name: str, path: str, data: bytes, mode: int | None = None) -> None:
        """Write a file on a node (parents created, replaced atomically)."""
        quoted, tmp = shlex.quote(path), shlex.quote(f"{path}.tmp{threading.get_ident()}")
        chmod = f" && chmod {mode:o} {tmp}" if mode is not None else ""
        self._exec_raw(name, f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cat > {tmp}{chmod} && mv -f {tmp} {quoted}", data)

    def write_file(self, name: str, path: str, content: str) -> None:
        self.put_bytes(name, path, content.encode())

    def get_file(self, name: str, remote: str, local: Path) -> None:
        """Copy a node's file to the control machine; OSError if it does not exist."""
        try:
            data = self._exec_raw(name, f"cat {shlex.quote(remote)}")
        except NodeError as err:
            raise OSError(f"{name}: cannot read {remote}: {err.message}") from None
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)

    # --- jobs ---------------------------------------------------------------------------

    def stop_all(self, run_id: str, extra_stop: Callable[[str], str | None] | None = None,
                 names: Iterable[str] | None = None) -> dict[str, CommandResult]:
        """Stop every process tagged with ``run_id`` on every node (and the run's containers)."""
        names = list(names or (n.name for n in self.inventory.nodes))
        commands = {}
        for name in names:
            line = f"sh -c {shlex.quote(STOP_SCRIPT)} stop {shlex.quote(run_id)} {int(STOP_GRACE * 10)}"
            extra = extra_stop(name) if extra_stop else None
            commands[name] = f"{extra}; {line}" if extra else line
        def stop(name: str) -> CommandResult:
            # A short channel-open timeout: a node that cannot open a channel in 3 s is unreachable.
            try:
                out = self._exec_raw(name, commands[name], timeout=STOP_GRACE + 5, open_timeout=3)
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

    def run(
        self,
        shells: dict[str, str],
        *,
        run_id: str,
        log_dir: Path,
        deadline: float | None = None,
        extra_stop: Callable[[str], str | None] | None = None,
        relabel: Relabel | None = None,
        rejoin: Rejoin | None = None,
        before_stop: Callable[[NodeError], None] | None = None,
        stalled: Callable[[], str | None] | None = None,
    ) -> dict[str, NodeResult]:
        """Run ``shells[node]`` on every node at once; return when all ended, raise on the first failure
        (with ``rejoin``, a lost or killed node is first started again while its budget lasts).
        ``before_stop(failure)`` runs when the job failed (or hit its deadline), before the gang-stop: e.g. a
        capture of the ranks still alive (multinode.diagnose); it must bound its own time. ``stalled``
        (e.g. multinode.watchdog) says why the job stopped making progress, or None; a reason ends it as a failure."""
        log_dir.mkdir(parents=True, exist_ok=True)
        results = {name: NodeResult(name) for name in shells}
        events: queue.Queue[str] = queue.Queue()
        log_files = {name: open(log_dir / f"{name}.log", "a", encoding="utf-8") for name in shells}
        def node_job(name: str) -> None:
            result = results[name]
            result.started = time.monotonic()
            result.exit_code, result.error, result.lost, result.finished = None, None, False, None
            sinks = [TextSink(LineSink(name, self._print_lock, log_files[name], self.out, result.tail, relabel))
                     for _ in range(2)]
            command = f"export MULTINODE_RUN_ID={shlex.quote(run_id)} && {shells[name]}"
            try:
                result.exit_code, _, _ = self.execute(name, command, timeout=None, out=sinks[0], err=sinks[1])
            except Exception as err:  # lost SSH session: the node is gone or unreachable
                result.lost = True
                result.error = self._node_error(name, result, f"lost its SSH session ({describe_ssh_error(err)})", log_dir)
            finally:
                for sink in sinks:
                    sink.close()
                result.finished = time.monotonic()
                events.put(name)

        def start(name: str) -> None:
            threading.Thread(target=node_job, args=(name,), name=f"mn-job-{name}", daemon=True).start()

        with StopSignals() as stop:
            for name in shells:
                start(name)
            try:
                failure = self._watch(results, events, run_id, log_dir, deadline, extra_stop, rejoin, start, stop,
                                      before_stop, stalled)
            except StopRequested:
                signum = stop.signum
                what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
                self.say(f"{what}: stopping the job on every node")
                self._gang_stop(run_id, results, events, extra_stop)
                stopped = Interrupted(f"{what}; run {run_id} was stopped on every node")
                stopped.exit_code = 128 + signum
                raise stopped from None
            finally:
                for fh in log_files.values():
                    fh.close()
        if failure is not None:
            err = JobFailed(failure)
            err.results = results  # type: ignore[attr-defined]  # for the summary: every node's ending
            raise err
        return results

    def _watch(self, results: dict[str, NodeResult], events: "queue.Queue[str]", run_id: str, log_dir: Path,
               deadline: float | None, extra_stop: Callable[[str], str | None] | None,
               rejoin: Rejoin | None = None, start: Callable[[str], None] | None = None,
               stop: StopSignals | None = None, before_stop: Callable[[NodeError], None] | None = None,
               stalled: Callable[[], str | None] | None = None) -> NodeError | None:
        pending = set(results)
        end = None if deadline is None else time.monotonic() + deadline
        while pending:
            if stop is not None and stop.signum is not None:
                raise StopRequested
            try:
                name = events.get(timeout=0.2)
            except queue.Empty:
                if end is not None and time.monotonic() > end:
                    head = next(iter(results))
                    failure = NodeError(head, "job", None, f"deadline of {deadline:.0f} s passed; the job was stopped")
                    self.say(f"deadline of {deadline:.0f} s passed: stopping the job on every node")
                    self._before_stop(before_stop, failure)
                    self._gang_stop(run_id, results, events, extra_stop, pending, log_dir)
                    return failure
                why = stalled() if stalled is not None else None
                if why is not None:
                    failure = NodeError(next(iter(results)), "job", None, f"{why}; the job was stopped")
                    self.say(f"{why}: stopping the job on every node")
                    self._before_stop(before_stop, failure)
                    self._gang_stop(run_id, results, events, extra_stop, pending, log_dir)
                    return failure
                continue
            result = results[name]
            if result.finished is None:
                continue  # a relaunch started it again before this event was read
            if result.error is None and result.exit_code not in (0, None):
                result.error = self._node_error(name, result, f"exited with code {result.exit_code}", log_dir)
            if result.error is not None and self._may_rejoin(name, result, rejoin):
                result.relaunches += 1
                self.say(f"{name} {result.error.message}: starting it again when it answers "
                         f"(relaunch {result.relaunches}/{rejoin.budget})")
                threading.Thread(target=self._relaunch, args=(name, run_id, rejoin, extra_stop, start, events, results,
                                                              log_dir), name=f"mn-rejoin-{name}", daemon=True).start()
                continue
            pending.discard(name)
            if result.error is not None:
                self.say(f"{name} failed ({result.error.message}): stopping the job on every node")
                self._before_stop(before_stop, result.error)
                self._gang_stop(run_id, results, events, extra_stop, pending, log_dir)
                return result.error
        return None

    @staticmethod
    def _before_stop(hook: Callable[[NodeError], None] | None, failure: NodeError) -> None:
        """The caller's last look at the job before it is stopped; its failure never keeps the stop from happening."""
        if hook is None:
            return
        try:
            hook(failure)
        except Exception as err:  # a diagnosis that fails must not leave the job running
            log.warning("before the stop: %s: %s", type(err).__name__, err)

    @staticmethod
    def _may_rejoin(name: str, result: NodeResult, rejoin: Rejoin | None) -> bool:
        return (rejoin is not None and name not in rejoin.exclude and result.killed
                and result.relaunches < rejoin.budget)

    def _relaunch(self, name: str, run_id: str, rejoin: Rejoin, extra_stop, start, events, results, log_dir) -> None:
        """Wait for the node to answer SSH, clear what is left of the run on it, prepare it, start it again.
        If it does not come back within ``rejoin.wait``, its failure stands and ends the job."""
        result = results[name]
        self.drop(name)
        why = self.connect_until([name], time.monotonic() + rejoin.wait).get(name)
        if why is None:
            try:
                self.stop_all(run_id, extra_stop, names=[name])
                rejoin.prepare(name)
            except Exception as err:  # the node answered but cannot be prepared: its failure stands
                why = f"could not be prepared again: {err}"
        if why is not None:
            result.error = self._node_error(name, result, f"did not come back within {rejoin.wait:.0f} s ({why})", log_dir)
            result.relaunches = rejoin.budget  # no further attempt
            events.put(name)
            return
        self.say(f"{name} answers again: relaunching its part of run {run_id}")
        start(name)

    def _gang_stop(self, run_id: str, results: dict[str, NodeResult], events: "queue.Queue[str]",
                   extra_stop: Callable[[str], str | None] | None, pending: set[str] | None = None,
                   log_dir: Path | None = None) -> None:
        """Stop the run everywhere, then give the remaining sessions a bounded time to end.

        A node that does not even answer the stop command is unreachable (crashed, or cut off): its
        session is dropped at once and it is reported as lost, which makes it the likely root cause.
        """
        pending = set(pending if pending is not None else (n for n, r in results.items() if r.finished is None))
        end = time.monotonic() + LOST_GRACE
        answers = self.stop_all(run_id, extra_stop)
        unreachable = {name for name in pending if answers[name].exit_code is None}
        while pending - unreachable and time.monotonic() < end:
            try:
                pending.discard(events.get(timeout=0.2))
            except queue.Empty:
                continue
        for name in pending:
            result = results[name]
            why = "stopped answering (unreachable: no answer to the stop)" if name in unreachable else \
                f"did not end within {LOST_GRACE:.0f} s of the stop"
            log.warning("%s: %s; dropping its connection", name, why)
            if result.error is None and log_dir is not None:
                result.error = self._node_error(name, result, why, log_dir)
                result.finished = time.monotonic()
            self.drop(name)

    def _node_error(self, name: str, result: NodeResult, message: str, log_dir: Path) -> NodeError:
        return NodeError(name, "job", result.exit_code, message, tail=list(result.tail),
                         log_path=str(log_dir / f"{name}.log"))
