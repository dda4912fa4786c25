"""The one runner for everything that happens on nodes: short commands and files on one node or all at once, and
the stop by run id, over the pooled connections and shells of :class:`multinode.ssh.pool.NodePool`. A job on every
node at once is :class:`multinode.ssh.job.JobRun`'s (whole-line streaming, each part's end reported, its stop,
its relaunch).

Contract:

* Commands run without a pty: a lost connection does not kill the remote job (it is stopped explicitly, by run
  id), and stdout/stderr stay separate streams.
* :meth:`RemoteRunner.stop_all` stops every process whose environment carries ``MULTINODE_RUN_ID=<run id>``
  (torchrun starts workers in their own session: a process-tree or process-group kill would miss them) as the
  runner's :class:`StopPolicy` says, given once when the runner is built and the same for every stop it makes
  (a job's gang-stop, a notice, the run's sweep): SIGTERM, up to ``kill_after`` seconds for them to end, then
  SIGKILL. With GRACE that is GRACE and a little more, so that the ranks, for which SIGTERM is a notice, can write
  their coordinated checkpoint; the runtime's containers are then removed only after that wait.
* :meth:`RemoteRunner.retarget` moves the runner to the nodes of a later attempt (a node replaced, or gone): the
  connections of the nodes that did not change are kept.
* Which machines are gone is not the runner's to know: the run asks the provider and leaves them out of what it
  asks the runner to do (:mod:`multinode.app.watch`).
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from multinode.core.errors import NodeError
from multinode.core.inventory import Inventory
from multinode.ssh.connect import describe_ssh_error
from multinode.ssh.pool import NodePool, _parallel

log = logging.getLogger(__name__)

STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL on a node
# With GRACE: the stop's SIGKILL comes this long after the ranks' own grace is over, so that a launcher that
# enforces the same grace (torchrun's --shutdown-timeout, mpirun's odls_base_sigkill_timeout, training.guard)
# acts first and reports how its ranks ended.
GRACE_MARGIN = 2.0


@dataclass(frozen=True)
class StopPolicy:
    """How every stop of a runner ends a run's processes: SIGTERM, then SIGKILL ``kill_after`` seconds later.
    ``grace`` (GRACE): SIGTERM is a notice to the ranks, which get that long for one coordinated checkpoint."""

    grace: float | None = None

    @property
    def kill_after(self) -> float:
        return STOP_GRACE if self.grace is None else max(STOP_GRACE, self.grace + GRACE_MARGIN)

    @property
    def graceful(self) -> bool:
        """The runtime's containers are removed after the wait, not before (removing one kills what runs in it)."""
        return self.grace is not None

# Stop every process of one run on this node: match the exact environment entry, restricted to
# this node's network namespace (simulated nodes share one /proc). TERM, wait, KILL, report.
# list(): one grep and, where it matched, one stat for every match's namespace (a readlink per match made a
# sweep on a simulated node cost a process per live process of every other node).
# The wait is bounded by the clock (/proc/uptime, in hundredths of a second), not by a count of 0.1 s sleeps: each
# round also costs a list(), and on a loaded node (a spot day's replay in the suite: GRACE 45, 470 rounds) the
# rounds outlasted the caller's timeout (kill_after + 5 s), so the KILL was never sent and a rank that could not
# act on its TERM (the main thread inside a C++ all-reduce) kept the rendezvous port into the next attempt.
STOP_SCRIPT = r"""
tag="MULTINODE_RUN_ID=$1"; grace_cs=$2
now_cs() { read -r up _ < /proc/uptime; echo $(( ${up%.*} * 100 + 1${up#*.} - 100 )); }
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
deadline=$(( $(now_cs) + grace_cs ))
while [ "$(now_cs)" -lt "$deadline" ]; do sleep 0.1; pids=$(list); [ -z "$pids" ] && break; done
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


class RemoteRunner(NodePool):
    """Commands, files and the stop on the nodes of one inventory (see the module doc)."""

    def __init__(self, inventory: Inventory, out: TextIO | None = None, connect_timeout: float = 5.0,
                 stop: StopPolicy = StopPolicy()):
        super().__init__(inventory, out=out, connect_timeout=connect_timeout)
        self.stop = stop

    def retarget(self, inventory: Inventory) -> None:
        """The nodes of ``inventory`` from now on (a later attempt's): a node that is gone or was replaced (another
        address or host key) loses its connection; the others keep theirs."""
        old = {n.name: n for n in self.inventory.nodes}
        new = {n.name: n for n in inventory.nodes}
        self.forget_host_keys()  # a replacement's key was written to known_hosts
        self.inventory = inventory
        for name, node in old.items():
            if new.get(name) != node:
                self.drop(name)

    def say(self, message: str) -> None:
        with self.print_lock:
            print(f"[multinode] {message}", file=self.out, flush=True)

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

    def cut_off(self, lost: Iterable[str], names: Iterable[str], spare_port: int | None = None,
                peers: Iterable[str] = ()) -> dict[str, CommandResult]:
        """On ``names``, close every TCP connection to the ``lost`` nodes' cluster addresses (``ss -K``: the
        kernel's socket destroy, as root or through ``sudo -n``). A machine that vanished sends no FIN or RST, so a
        rank blocked in a collective with it waits for the process-group timeout; its connections closed, the
        collective fails at once and our trainer's surviving ranks keep the last completed step
        (training/survivor.py) without that wait. ``peers``: nodes whose connections are cut too, in the same
        command, but those to or from ``spare_port`` (the survivors' old group among themselves at a membership
        change, the job's store kept; one round for both: a node slow to answer delays it once). Best effort: where
        the kernel lacks socket destroy (CONFIG_INET_DIAG_DESTROY) or root cannot be had, nothing changes and the
        timeout stands."""
        by_name = {n.name: n.private_ip for n in self.inventory.nodes}
        # ss's own parentheses, escaped for the sh -c that runs the line (bare, sh refused the whole line)
        spare = f" and not \\( sport = :{spare_port} or dport = :{spare_port} \\)" if spare_port else ""
        cuts = [(by_name[n], "") for n in lost if n in by_name]
        cuts += [(by_name[n], spare) for n in peers if n in by_name]
        names = list(names)
        if not cuts or not names:
            return {}
        # -t: TCP only (gloo's and NCCL's socket transport); without it ss also dumps every other family, and one of
        # them answered "RTNETLINK answers: Invalid argument" on this machine's kernel (its TCP sockets still closed)
        destroy = "; ".join(f"ss -K -t dst {shlex.quote(ip)}{kept}" for ip, kept in cuts)
        line = (f'{{ if [ "$(id -u)" = 0 ]; then sh -c {shlex.quote(destroy)}; '
                f'else sudo -n sh -c {shlex.quote(destroy)}; fi; }} >/dev/null 2>&1; true')
        return self.run_all(line, names, timeout=5)

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
        """Stop every process tagged with ``run_id`` on every node, or on ``names`` (and the run's containers); the
        caller leaves out a node it knows is gone (the run's attempt loop knows which)."""
        names = [n.name for n in self.inventory.nodes] if names is None else list(names)
        commands = {name: self.stop_line(run_id, extra_stop(name) if extra_stop else None) for name in names}

        def stop(name: str) -> CommandResult:
            # A short channel-open timeout: a node that cannot open a channel in 3 s is unreachable.
            try:
                out = self.run_with_input(name, commands[name], timeout=self.stop.kill_after + 5, open_timeout=3)
            except Exception as err:  # no answer, or the stop itself failed
                return CommandResult(name, None, error=describe_ssh_error(err))
            return CommandResult(name, 0, out.decode(errors="replace"))

        answers = _parallel(stop, commands, self.stop.kill_after + 8)
        results = {name: value if done and isinstance(value, CommandResult) else CommandResult(name, None, error=str(value))
                   for name, (done, value) in answers.items()}
        for name, res in results.items():
            if not res.ok:
                log.warning("%s: could not stop run %s: %s", name, run_id, res.error or res.stderr.strip())
            elif "left" in res.stdout:
                log.warning("%s: processes of run %s survived SIGKILL: %s", name, run_id, res.stdout.strip())
        return results

    def stop_line(self, run_id: str, extra: str | None = None) -> str:
        """The stop of ``run_id`` on one node, with the runtime's ``extra`` step (its containers): before the
        processes' stop, or with GRACE after it (removing a container kills what runs in it at once)."""
        line = f"sh -c {shlex.quote(STOP_SCRIPT)} stop {shlex.quote(run_id)} {int(self.stop.kill_after * 100)}"
        if not extra:
            return line
        return f"{line}; {extra}" if self.stop.graceful else f"{extra}; {line}"
