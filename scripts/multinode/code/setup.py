"""SETUP: prepare each node's own environment for the project, once, before any rank starts.

Contract:

* Each node gets its own environment at ``<node workdir>/env``: a venv (``--without-pip``) layered on the
  Python the job would use -- the cluster's venv (host runtime) or the image's (docker runtime) -- through a
  ``.pth`` that adds that Python's site directories after its own. What SETUP installs lands in the node's
  environment only (local nodes share one disk: one node's setup cannot change another's, nor the cluster's);
  the cluster's packages stay visible. ``pip`` in it is that Python's pip, installing into the environment.
* SETUP runs in WORKDIR on the node, in the job's runtime (``runtimes.to_shell``: docker wraps it too),
  with ENV's variables, its output streamed with the ``[node-i]`` prefix. The job's ranks then run the
  environment's Python (:func:`multinode.plan.launchers.base.node_python`).
* It runs again only when its inputs changed: :func:`setup_hash` of the command, the interpreter/image
  and the content of the WORKDIR files named in the command (``requirements.txt`` in
  ``pip install -r requirements.txt``; files those files include are not followed). The hash is stored
  in the environment only after SETUP succeeded; a failure leaves no stamp, so the next run retries.
* A failure on any node is one line naming the node, and no rank starts.
* On a terminal, SETUP on several nodes is one updating line (:class:`SetupBoard`: how many nodes are done, the
  latest line of one still running), not every node's output; a failed node's last lines are printed after it.
  Anywhere else every line is streamed as it comes.
"""

from __future__ import annotations

import hashlib
import signal
import json
import shlex
import tempfile
import threading
from pathlib import Path
from typing import TextIO

from multinode.core.config import LaunchSpec
from multinode.core.errors import Interrupted, NodeError, UserError
from multinode.core.progress import Progress, is_terminal
from multinode.core.inventory import Inventory
from multinode.core.nodepaths import env_file, setup_env_dir
from multinode.plan.launchers.base import BASE_ENV, NodeCommand
from multinode.ssh.runner import RemoteRunner
from multinode.plan.runtime import runtime_for
from multinode.core.events import Events
from multinode.ssh.job import JobRun, until_ended
from multinode.code.workdir import Manifest

STAMP = ".multinode-setup"

# $1 env dir, $2 wanted hash, $3 the Python to layer on, $4 the ENV file ("" if none), $5 SETUP.
SCRIPT = r"""
env=$1; want=$2; py=$3; envfile=$4; cmd=$5
if [ -x "$env/bin/python" ] && [ "$(cat "$env/.multinode-setup" 2>/dev/null)" = "$want" ]; then
  echo "SETUP: inputs unchanged since the last run on this node; skipped"; exit 0
fi
rm -rf "$env" && "$py" -m venv --without-pip "$env" || exit 1
site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || exit 1
"$py" -c '
import os, site, sysconfig
dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
seen = []
for d in dirs:
    if os.path.isdir(d) and d not in seen:
        seen.append(d)
print("".join("import site; site.addsitedir(%r)\n" % d for d in seen), end="")
' > "$site/_multinode_base.pth" || exit 1
printf '#!/bin/sh\nexec "%s/bin/python" -m pip "$@"\n' "$env" > "$env/bin/pip" && chmod 755 "$env/bin/pip" \
  && cp "$env/bin/pip" "$env/bin/pip3" || exit 1
if [ -n "$envfile" ]; then . "$envfile" || exit 1; fi
echo "SETUP: $cmd"
VIRTUAL_ENV=$env PATH="$env/bin:$PATH" PIP_DISABLE_PIP_VERSION_CHECK=1 sh -c "$cmd" || exit $?
echo "$want" > "$env/.multinode-setup"
echo "SETUP: done on this node"
"""


def named_files(setup: str, manifest: Manifest) -> list[str]:
    """Pure: the WORKDIR files a SETUP command names (``-r requirements.txt``, ``--requirement=req.txt``...)."""
    try:
        words = shlex.split(setup)
    except ValueError:
        words = setup.split()
    found = []
    for word in words:
        for candidate in (word, word.partition("=")[2], word[2:] if word.startswith("-r") else ""):
            path = candidate.removeprefix("./")
            if path and path in manifest.files and path not in found:
                found.append(path)
    return found


def setup_hash(setup: str, manifest: Manifest, interpreter: str, image: str | None) -> str:
    """Pure: what decides whether SETUP must run again on a node."""
    files = {path: manifest.files[path].sha256 for path in named_files(setup, manifest)}
    blob = json.dumps({"setup": setup, "python": interpreter, "image": image, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def plan_setup(inventory: Inventory, spec: LaunchSpec, manifest: Manifest, cwd_for) -> dict[str, NodeCommand]:
    """Pure: per node, the command that (re)builds its environment and runs SETUP in ``cwd_for(node)``."""
    assert spec.setup is not None
    want = setup_hash(spec.setup, manifest, inventory.interpreter, inventory.image)
    commands = {}
    for node in inventory.nodes:
        envfile = env_file(inventory, node.name, spec.run_id) if spec.env else ""
        commands[node.name] = NodeCommand(
            node=node.name,
            argv=("sh", "-c", SCRIPT, "multinode-setup", setup_env_dir(inventory, node.name), want,
                  inventory.interpreter, envfile, spec.setup),
            cwd=cwd_for(node.name), env=dict(BASE_ENV),  # the script sources the ENV file itself (host or container)
        )
    return commands


def run_setup(runner: RemoteRunner, spec: LaunchSpec, manifest: Manifest, cwd_for, out: TextIO,
              names: list[str] | None = None) -> None:
    """Run SETUP on every node (or ``names``) at once; UserError naming the first node where it failed."""
    inv = runner.inventory
    commands = plan_setup(inv, spec, manifest, cwd_for)
    runtime = runtime_for(inv, spec.run_id)
    lines = {name: runtime.wrap(cmd) for name, cmd in commands.items() if names is None or name in names}
    # Its output is streamed; the logs go to a scratch directory: a refused job leaves no run directory.
    board = SetupBoard(list(lines), runner.out) if len(lines) > 1 and is_terminal(runner.out) else None
    with tempfile.TemporaryDirectory(prefix="multinode-setup-") as scratch:
        job = JobRun(runner, lines, run_id=spec.run_id, log_dir=Path(scratch), events=Events(),
                     extra_stop=runtime.stop_line, observe=board.observe if board else None)
        outcome = until_ended(job, spec.deadline)
        if board is not None:
            board.end(outcome, Path(scratch))
        if outcome.kind == "interrupted":
            raise Interrupted(signal.Signals[outcome.stopped_by].value, outcome.failure.message)
        if outcome.kind != "succeeded":
            first = outcome.failure or NodeError(inv.head.name, "setup", None, f"ended {outcome.kind}")
            code = "no exit code" if first.returncode is None else f"exit {first.returncode}"
            seen = [*first.tail, board.last.get(first.node, "")] if board else list(first.tail)
            last = next((line for line in reversed(seen) if line.strip()), "")
            raise UserError(f"SETUP failed on {first.node} ({code}{': ' + last.strip() if last else ''}); "
                            f"no rank was started; fix SETUP or the files it uses and run again") from None


class SetupBoard:
    """SETUP on several nodes, on a terminal: the job's observer (``JobRun``'s ``observe``) keeps every line off
    the console and shows one updating line -- ``N of M nodes done``, and the latest line of a node still running;
    the node logs keep every line. :meth:`end` says how it ended and prints a failed node's last lines."""

    TAIL = 15

    def __init__(self, names: list[str], out: TextIO) -> None:
        self.names, self.out = names, out
        self.progress = Progress("[multinode] setup", out, terminal=True)
        self.done: set[str] = set()
        self.last: dict[str, str] = {}
        self.lock = threading.Lock()

    def observe(self, node: str, line: str) -> bool:
        with self.lock:
            if line.startswith(("SETUP: done on this node", "SETUP: inputs unchanged")):
                self.done.add(node)
            elif line.strip():
                self.last[node] = line.strip()
            running = [name for name in self.names if name not in self.done and name in self.last]
            latest = f"; {running[-1]}: {self.last[running[-1]]}" if running else ""
            self.progress.update(f"{len(self.done)} of {len(self.names)} nodes done{latest}")
        return True

    def end(self, outcome, logs: Path) -> None:
        if outcome.kind == "succeeded":
            self.progress.done(f"{len(self.names)} of {len(self.names)} nodes done")
            return
        self.progress.done(f"{len(self.done)} of {len(self.names)} nodes done; SETUP {outcome.kind}")
        failed = outcome.failure.node if outcome.failure else None
        log = logs / f"{failed}.log"
        if failed and log.exists():
            for line in log.read_text(errors="replace").splitlines()[-self.TAIL:]:
                print(f"[{failed}] {line}", file=self.out)
