"""``python -m training.guard --grace SECONDS -- COMMAND ...``: a notice for a job that does nothing about one.

A script that never imports :mod:`training.preempt` still gets what every program understands: on a spot
interruption notice (the node's metadata service, :mod:`training.imds`) or a SIGTERM to the guard itself, the
guard sends SIGTERM to the command's process group, waits ``--grace`` seconds for it to end (saving what it can), then
SIGKILLs what is left. Without a notice it only waits for the command; a rebalance recommendation is said in one
line and the command goes on (no signal: it is a risk, not a stop), as is a notice older than the guard.

It honours the switches the ranks do (:mod:`training.preempt`): with ``MULTINODE_NOTICES=off`` the metadata
service is never asked (a SIGTERM to the guard itself is still passed on to the command: a wrapper that died of it
would leave the command running); ``MULTINODE_NOTICE_POLL=<seconds>`` is the poll interval unless ``--poll``
gives one (AWS's 5 s without either).

Exit status: the command's own; 75 (:data:`training.preempt.EXIT_PREEMPTED`) when a notice ended it by a
signal, or a SIGTERM did (the command did not choose a code of its own); 2 for bad input. Standard library
only: it runs on the node before anything is imported. The launchers put it in front of a user script's
command when GRACE is set (``multinode.plan.launchers.base.guard_argv``), and under torchrun in front of every
worker, started by path from the copy the orchestrator syncs to every node (``<code dir>/guard/``,
:mod:`multinode.code.sync`): no node, image or SLURM task needs our package installed.

Ending preempted (75), the guard also:

* writes the file ``$MULTINODE_PREEMPT_MARK`` names, if set: the node's note that its ranks were preempted
  (torchrun's own exit code cannot say it; the launcher's shell turns the note into the node's 75);
* under torchrun (``TORCHELASTIC_RUN_ID`` set by the agent for its workers), sends SIGTERM to its agent, its
  parent: torch's agent restarts a worker group whose worker exited non-zero while restarts are left (75 is no
  exception), and takes its shutdown path instead when it is signalled (``SimpleElasticAgent.run``, torch 2.13).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading

# Run by path (``python -I <node's code dir>/guard/guard.py``: how the launchers start it, the orchestrator syncs this
# file and its siblings there), the guard loads its siblings as a package of a private name: nothing on the
# interpreter's path is asked for a ``training`` package, so neither a project's own ``training`` nor one installed
# on the node (another version of ours) can shadow them. ``python -m training.guard`` imports them as usual.
PRIVATE_PACKAGE = "_multinode_guard"


def _siblings():
    """(imds, notice, channel): this file's own siblings, whichever way it was started."""
    if __package__:
        from . import channel, imds, notice
        return imds, notice, channel
    here = os.path.dirname(os.path.abspath(__file__))
    if PRIVATE_PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(PRIVATE_PACKAGE, os.path.join(here, "__init__.py"),
                                                      submodule_search_locations=[here])
        package = importlib.util.module_from_spec(spec)
        sys.modules[PRIVATE_PACKAGE] = package
        spec.loader.exec_module(package)
    return tuple(importlib.import_module(f"{PRIVATE_PACKAGE}.{name}") for name in ("imds", "notice", "channel"))


imds, _notice, _channel = _siblings()
EXIT_PREEMPTED, Watcher = _notice.EXIT_PREEMPTED, _notice.Watcher
POLL_ENV = _notice.POLL_ENV
MARK_ENV, GUARD_ENV = _channel.PREEMPT_MARK_ENV, _channel.GUARD_ENV


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (no usage block)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="python -m training.guard",
                                     description="SIGTERM, a grace, then SIGKILL for a command on a notice")
    parser.add_argument("--grace", type=float, required=True, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--poll", type=float, default=None,
                        help=f"metadata poll interval (s); default ${POLL_ENV}, else {imds.POLL_SECONDS:g}")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given; usage: python -m training.guard --grace 60 -- python train.py")
    if not args.grace > 0:
        parser.error(f"--grace {args.grace:g} must be a positive number of seconds")
    if args.poll is not None and not args.poll > 0:
        parser.error(f"--poll {args.poll:g} must be a positive number of seconds")
    return args


def notice_settings(env, poll: float | None) -> tuple[bool, float]:
    """(whether to read the metadata service, its poll interval) as the environment and ``--poll`` say: the
    switches of :func:`training.notice.watch`; ValueError with the fix for a bad ``MULTINODE_NOTICE_POLL``."""
    return _notice.reads_metadata(env), poll if poll is not None else _notice.poll_from_env(env)


def run(command: list[str], grace: float, poll: float, use_imds: bool) -> int:
    """Run ``command``; on a notice, its process group gets SIGTERM, ``grace`` seconds, then SIGKILL."""
    watcher = Watcher(imds.MetadataClient() if use_imds else None, grace, poll).start()
    try:
        child = subprocess.Popen(command, start_new_session=True, env=_command_env(os.environ))
    except OSError as err:
        print(f"training.guard: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 2
    done = threading.Event()

    def enforce() -> None:
        while not watcher.wait(0.2):
            if done.is_set():
                return
            rebalance = watcher.take_rebalance()
            if rebalance is not None:  # an elevated risk, not a stop (training.imds.Notice.stops)
                print(f"training.guard: {rebalance.describe()}: the job goes on (a rebalance is not a stop)",
                      file=sys.stderr, flush=True)
        print(f"training.guard: {watcher.notice.describe()}: SIGTERM to the job, SIGKILL in {grace:g} s",
              file=sys.stderr, flush=True)
        _signal_group(child.pid, signal.SIGTERM)
        if not done.wait(grace):
            _signal_group(child.pid, signal.SIGKILL)

    threading.Thread(target=enforce, daemon=True).start()
    code = child.wait()
    done.set()
    watcher.close()
    if code < 0 and (watcher.requested() or code == -signal.SIGTERM):
        # Ended by our signal, or by a SIGTERM of its own: a preemption, not a failure. The guard exists only with
        # GRACE, where a SIGTERM to the job is a notice, and a scheduler signals every process of the job at once
        # (SLURM's proctrack, docker stop's whole container): the command may take it and end before the guard's own
        # handler has run (seen on a SLURM node, tests/integration/test_slurm_grace.py).
        code = EXIT_PREEMPTED
    if code == EXIT_PREEMPTED:
        preempted(os.environ)
    return code if code >= 0 else 128 - code


def preempted(env) -> None:
    """The command ended preempted: note it for the node, and keep torchrun's agent from restarting it."""
    mark = env.get(MARK_ENV)
    if mark:
        try:
            with open(mark, "w") as fh:
                fh.write(f"{os.getpid()}\n")
        except OSError as err:
            print(f"training.guard: cannot write {mark}: {err.strerror}", file=sys.stderr)
    if env.get("TORCHELASTIC_RUN_ID") and os.getppid() > 1:
        os.kill(os.getppid(), signal.SIGTERM)


def _command_env(env) -> dict[str, str]:
    """The command's environment: the guard's, less the variable that marks the guard's own process (the
    launchers start it as ``env MULTINODE_GUARD=1 python -m training.guard``), so the rank it starts is the rank."""
    return {key: value for key, value in env.items() if key != GUARD_ENV}


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        use_imds, poll = notice_settings(os.environ, args.poll)
    except ValueError as err:
        print(f"training.guard: {err}", file=sys.stderr)
        return 2
    return run(args.command, args.grace, poll, use_imds)


if __name__ == "__main__":
    sys.exit(main())
