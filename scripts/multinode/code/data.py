"""DATA: a bucket prefix mirrored to every node before the job, by the nodes themselves, in parallel.

Each node runs our bucket module (``training/bucket.py``, standard library and boto3, its text given to the
node's Python with ``-c``) as ``sync DATA <DATA_DIR>``: the node lists the prefix and fetches only the objects
whose ETag or size changed since its last fetch (the rule is the module's); the orchestrator relays no byte.
Credentials are the node's: the run's ENV file is sourced first when ENV is set (written 0600 for the step and
removed after it, as for SETUP), else boto3 finds the instance profile; no value is printed or put in argv.

While it runs, each node's ``PROGRESS`` lines become one line per node on a terminal, rewritten in place; on
anything else (a pipe, CI) a plain line per node at most every :data:`PLAIN_EVERY` seconds. Either way each node ends with one plain line (:func:`describe`):
``data on node-0: 3 files (1234 bytes, 1.2 KiB) fetched, 0 unchanged, 0 deleted, 3 in all, s3://b/p -> <dir>``
(on a terminal cut to its width, the paths last).
A node that fails stops the run before any rank starts: one line naming the node and its error's last line.
The syncs carry the run id like a job's processes: Ctrl-C while they run stops them on every node and removes the
ENV files (test_data_local.py shows nothing left; closing the connections alone also ends them there).
"""

from __future__ import annotations

import json
import shlex
import shutil
import threading
import time
from typing import TextIO

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import data_dir, env_file
from multinode.code.prepare import remove_env_files, write_env_files
from multinode.core.resources import trainer_dir
from multinode.plan.launchers.base import BASE_ENV, NodeCommand
from multinode.plan.runtime import runtime_for
from multinode.ssh.runner import RemoteRunner

PLAIN_EVERY = 30.0  # seconds between a node's progress lines when the output is not a terminal
# $1: the ENV file ("" if none); then the command. Sourced in a shell of its own: its values reach boto3 only.
WITH_ENV = '[ -z "$1" ] || . "$1" || exit 1; shift; exec "$@"'


def bucket_source() -> str:
    """The node-side module's text (run with ``python -c``: nothing to sync first)."""
    return (trainer_dir() / "bucket.py").read_text()


def node_command(inventory: Inventory, spec: LaunchSpec, node: str, *args: str) -> NodeCommand:
    """Pure: ``python -c <bucket.py> <args>`` on ``node``, after sourcing the run's ENV file when there is one."""
    envfile = env_file(inventory, node, spec.run_id) if spec.env else ""
    return NodeCommand(node=node, argv=("sh", "-c", WITH_ENV, "multinode-bucket", envfile, inventory.interpreter,
                                        "-c", bucket_source(), *args),
                       cwd=inventory.workdir_for(node), env=dict(BASE_ENV))


def plan_data(inventory: Inventory, spec: LaunchSpec, names: list[str]) -> dict[str, NodeCommand]:
    """Pure: per node, the command that mirrors DATA into its DATA_DIR."""
    assert spec.data is not None
    return {name: node_command(inventory, spec, name, "sync", spec.data, data_dir(inventory, name, spec.data_dir))
            for name in names}


def _size(n: float) -> str:
    return f"{n:.0f} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / 2**20:.1f} MiB"


def describe(url: str, directory: str, node: str, report: dict) -> str:
    """The node's last line (module doc)."""
    fetched = report["fetched"]
    return (f"data on {node}: {fetched} file{'s' * (fetched != 1)} ({report['fetched_bytes']} bytes, "
            f"{_size(report['fetched_bytes'])}) fetched, {report['unchanged']} unchanged, {report['deleted']} deleted, "
            f"{report['files']} in all, {url} -> {directory}")


class Board:
    """One line per node: rewritten in place on a terminal (ANSI cursor moves); otherwise plain lines, a node's
    progress at most every :data:`PLAIN_EVERY` seconds and its last line."""

    def __init__(self, out: TextIO, names: list[str]):
        self.out, self.names = out, names
        self.live = hasattr(out, "isatty") and out.isatty()
        self.lines = {name: f"data on {name}: listing" for name in names}
        self.said = {name: time.monotonic() for name in names}
        self.lock = threading.Lock()
        if self.live:
            print("\n".join(self.lines.values()), file=out, flush=True)

    def show(self, node: str, line: str, final: bool = False) -> None:
        with self.lock:
            self.lines[node] = line
            if self.live:  # a line longer than the terminal would wrap and move the others: cut it
                up = len(self.names) - self.names.index(node)
                width = shutil.get_terminal_size().columns - 1
                self.out.write(f"\x1b[{up}A\r\x1b[2K{line[:width]}\x1b[{up}B\r")
                self.out.flush()
            elif final or time.monotonic() - self.said[node] >= PLAIN_EVERY:
                self.said[node] = time.monotonic()
                print(line, file=self.out, flush=True)

    def progress(self, node: str, done: dict) -> None:
        self.show(node, f"data on {node}: {done['files_done']}/{done['files']} files, "
                        f"{_size(done['bytes_done'])} of {_size(done['bytes'])}")


class _Lines:
    """A node's stdout bytes -> whole lines for ``handle``."""

    def __init__(self, handle):
        self.handle, self.buffer = handle, b""

    def __call__(self, data: bytes) -> None:
        self.buffer += data
        *whole, self.buffer = self.buffer.split(b"\n")
        for line in whole:
            self.handle(line.decode(errors="replace"))


def sync_data(runner: RemoteRunner, spec: LaunchSpec, out: TextIO, names: list[str] | None = None) -> dict[str, dict]:
    """Mirror DATA on every node (or ``names``) at once; {node: its SYNCED report}. UserError naming the first
    node that failed (nothing of the job has started)."""
    inv = runner.inventory
    names = names or [n.name for n in inv.nodes]
    runtime = runtime_for(inv, spec.run_id)
    # Tagged with the run id, as a job is (multinode.ssh.job): a stop of the run finds the syncs too.
    commands = {name: f"export MULTINODE_RUN_ID={shlex.quote(spec.run_id)} && {runtime.wrap(cmd)}"
                for name, cmd in plan_data(inv, spec, names).items()}
    board, reports = Board(out, names), {}

    def one(name: str) -> None:
        def line(text: str) -> None:
            word, _, payload = text.partition(" ")
            if word == "PROGRESS":
                board.progress(name, json.loads(payload))
            elif word == "SYNCED":
                reports[name] = json.loads(payload)

        code, _out, err = runner.execute(name, commands[name], timeout=spec.deadline, out=_Lines(line))
        if code != 0 or name not in reports:
            last = [t for t in err.decode(errors="replace").splitlines() if t.strip()][-1:] or [f"exit {code}"]
            raise UserError(f"DATA={spec.data}: the sync failed on {name}: {last[0].strip()}; no rank was started")
        board.show(name, describe(spec.data, data_dir(inv, name, spec.data_dir), name, reports[name]), final=True)

    write_env_files(runner, spec, names)
    try:
        errors = runner.parallel(one, names, timeout=spec.deadline or 24 * 3600)
    except BaseException:  # Ctrl-C (KeyboardInterrupt) while the nodes fetch: no sync left running anywhere
        runner.stop_all(spec.run_id, extra_stop=runtime.stop_line, names=names)
        raise
    finally:
        remove_env_files(runner, spec, names)
    for name in names:
        if errors.get(name) is not None:
            err = errors[name]
            raise err if isinstance(err, UserError) else UserError(f"DATA={spec.data}: the sync failed on {name}: "
                                                                   f"{err}; no rank was started")
    return reports


def check_command(inventory: Inventory, spec: LaunchSpec, node: str, url: str, need: str) -> str:
    """Shell: the pre-flight check of ``url`` on ``node`` (multinode.code.bucketcheck)."""
    return runtime_for(inventory, spec.run_id).wrap(node_command(inventory, spec, node, "check", url, need))

