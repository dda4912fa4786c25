"""Command line: parsing only. Everything it does is a call into :mod:`multinode.app.verbs`.

    multinode up     [--provider local|aws] [--nodes N] [--cluster-type cpu|g4dn|g4ad] [--mtu M] [-o key=value]
    multinode train  [--task multinode.yaml] [--mode cpu|gpu|mpi|mpi-gpu] [--nodes N] [--nproc P|auto]
                     [--script PATH|"-m pkg.mod"] [--args "..."] [--workdir DIR] [--setup "CMD"] [--env "NAME OTHER=value"]
                     [--launcher auto|torchrun|static] [--grace S] [--resume] [--recover N] [--recover-wait S]
                     [--dry-run] [--queue] ...   (python -m multinode.core.settings --markdown lists them all)
                     [script.py [script args] | -m pkg.mod [module args]]   (as torchrun takes them)
    multinode down | status | logs [--run ID] [--node I] | stacks [--run ID] | ssh NODE [CMD...] | reap --region R [--yes]

The flags of ``up`` and ``train`` (and ``--yes``) are their settings, declared once
(:mod:`multinode.core.settings`). Precedence: flag > environment (``MULTINODE_<NAME>``, which the Makefile sets
from ``NODES=...``) > default; for ``train``: flag > environment > task file (``WORKDIR/multinode.yaml`` or
``--task``) > default. A switch (``--dry-run``, ``DRY_RUN=1``) takes 1/0, yes/no or true/false and refuses
anything else.
The program typed torchrun's way (``train [options] script.py [args]``, ``train [options] -m pkg.mod [args]``) is
the ``--script`` and ``--args`` flags it stands for (:func:`_program_flags`): one path into the LaunchSpec. Giving
the script both ways, or its arguments both ways, is refused. ``--help`` shows :data:`DESCRIPTION` and the
verbs' own texts, written for users; this docstring is the module's contract.
User errors print one line and exit 2; a failed job exits 1 and names the node and rank; Ctrl-C exits 130 (SIGTERM 143, SIGHUP 129) after the
step it interrupted has cleaned up (:class:`multinode.ssh.signals.Interrupts`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from multinode.app import verbs
from multinode.core import settings
from multinode.core.config import DEFAULT_CLUSTER, ClusterSpec, LaunchSpec, env_default, new_run_id
from multinode.core.errors import Interrupted, MultinodeError, UserError, signal_exit
from multinode.core.setting import Setting
from multinode.core.settings import add_flags
from multinode.core.sources import Settled, pick, settle, value_of
from multinode.core.taskfile import KEYS, find_task
from multinode.ssh.signals import Interrupts

log = logging.getLogger("multinode")

DESCRIPTION = """Run a PyTorch data-parallel job on every node of a cluster: simulated nodes on this machine
(--provider local), EC2 instances (--provider aws) or an existing cluster (--provider hosts). Run it from your
project's directory: a cluster's state lives in .multinode/<cluster>/ there (or under $MULTINODE_HOME)."""
EPILOG = """examples:
  multinode up --nodes 2                        two simulated nodes on this machine
  multinode train                               the bundled trainer (digits, 10 epochs) on them
  multinode train train.py --epochs 3           your script, its arguments after it (as torchrun takes them)
  multinode train --nodes 2 -m pkg.train --lr 1 a module of your project (python -m)
  multinode logs                                the latest run's logs
  multinode down                                destroy the cluster and check that nothing is left
  multinode up --provider aws -o region=us-east-1 -o ssh_cidr=203.0.113.4/32
Each verb's options: multinode <verb> --help. Every setting also reads MULTINODE_<NAME> from the environment."""
TRAIN_DESCRIPTION = """Run the job on the cluster's nodes: the bundled trainer, or your script given after the
options (train.py [its args], or -m pkg.mod [its args]) or by --script. Your script's directory (or --workdir) is
synced to every node; a multinode.yaml task file there gives defaults for these options. Each option also reads
MULTINODE_<NAME> (--nodes: MULTINODE_NODES); a flag wins over the variable, the variable over the task file."""
MODULE_FLAG = "-m"  # train's torchrun-style module flag (parse)


def _options(pairs: Sequence[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"option {pair!r} must look like key=value, e.g. -o region=us-east-1")
        options[key] = value
    return options


def _add_up(sub: argparse._SubParsersAction) -> None:
    """``up``: provision the cluster (its settings: :data:`multinode.core.settings.UP`)."""
    up = sub.add_parser("up", help="provision the cluster")
    add_flags(up, settings.UP)
    up.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="provider option (aws: region, ssh_cidr, owner, ttl_hours, spot, ...)")


def _add_down(sub: argparse._SubParsersAction) -> None:
    """``down``: destroy the cluster and verify nothing is left."""
    down = sub.add_parser("down", help="destroy the cluster and verify nothing is left")
    add_flags(down, [settings.YES])
    add_flags(down, [settings.find(settings.UP, "provider")])  # only needed when the inventory is gone


def _add_train(sub: argparse._SubParsersAction) -> None:
    """``train``: the job; its flags are its settings (:data:`multinode.core.settings.TRAIN`), each None when not
    typed: :func:`multinode.core.sources.settle` picks flag > make variable > task file > default and knows which
    one it took."""
    train = sub.add_parser("train", help="run the training job on the cluster", description=TRAIN_DESCRIPTION,
                           usage="multinode train [options] [script.py [args] | -m pkg.mod [args]]")
    add_flags(train, settings.TRAIN)
    # -m is not an argparse option: one would take --script "-m pkg.train" for itself (-m with " pkg.train" attached).
    # argparse leaves it over, and parse() reads it (MODULE_FLAG).
    train.add_argument("program", nargs="?", default=None, metavar="script.py | -m pkg.mod",
                       help="your script (a path in your project) or, after -m, a module run as python -m (torchrun's "
                            "-m); unset: the bundled trainer")
    train.add_argument("program_args", nargs=argparse.REMAINDER, metavar="args",
                       help="the program's own arguments: everything after it")


def _add_run_verbs(sub: argparse._SubParsersAction) -> None:
    """``logs``, ``report`` and ``stacks``: a run's logs, its page (ledger, timeline per node, loss, step time per
    rank, throughput), the Python stacks of its live ranks; each the run's by RUN."""
    add_flags(sub.add_parser("logs", help="show a run's logs (default: the latest run)"), [settings.RUN, settings.NODE])
    add_flags(sub.add_parser("report", help="write a run's report.html in its run directory and print its path "
                                            "(default: the latest run)"), [settings.RUN])
    add_flags(sub.add_parser("stacks", help="Python stacks of every rank of a running job, identical ones grouped"),
              [settings.RUN])


def _add_netcheck(sub: argparse._SubParsersAction) -> None:
    """``netcheck``: the cluster's links and collectives, measured on demand."""
    net = sub.add_parser("netcheck", help="node-to-node bandwidth (iperf3) and an all_reduce sweep, as tables and a plot")
    add_flags(net, [settings.find(settings.UP, "nodes")])  # unset: every node


def _add_preempt(sub: argparse._SubParsersAction) -> None:
    """``preempt``: a spot interruption notice on a local node, as EC2 sends one."""
    pre = sub.add_parser("preempt", help="arm a spot interruption notice (or a rebalance recommendation) on a local "
                         "node (its metadata endpoint)")
    add_flags(pre, [settings.NODE, settings.IN, settings.NOTICE])


def _add_ssh(sub: argparse._SubParsersAction) -> None:
    """``ssh``: a shell (or a command) on a node."""
    ssh = sub.add_parser("ssh", help="open a shell on a node (pinned host key)")
    ssh.add_argument("node", nargs="?", default=env_default("NODE", "0"))
    ssh.add_argument("remote_command", nargs=argparse.REMAINDER)


def _add_reap(sub: argparse._SubParsersAction) -> None:
    """``reap``: leaked instances tagged by multinode."""
    reap = sub.add_parser("reap", help="find (and with --yes terminate) leaked instances tagged by multinode")
    add_flags(reap, [replace(settings.find(settings.AWS, "region"), flag=True)])  # up takes it as -o region=
    add_flags(reap, [settings.YES])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multinode", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(settings.CLUSTER.option, default=value_of(settings.CLUSTER, None, os.environ),
                        help=f"{settings.CLUSTER.help} (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (SSH included)")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_up(sub)
    _add_down(sub)
    sub.add_parser("status", help="show the nodes and whether each answers SSH")
    _add_train(sub)
    _add_run_verbs(sub)
    _add_netcheck(sub)
    _add_preempt(sub)
    _add_ssh(sub)
    _add_reap(sub)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, parsed (argparse's own errors: usage and one line, exit 2)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    _module_flag(parser, args, extras)
    return args


def _value(setting: Setting, args: argparse.Namespace) -> Any:
    """flag > MULTINODE_<VARIABLE> > default, typed (a bad value: one line naming the variable)."""
    return value_of(setting, getattr(args, setting.name), os.environ)


def _given(setting: Setting, args: argparse.Namespace) -> Any:
    """flag > MULTINODE_<VARIABLE>, typed; None when neither gave it (the verb has its own answer then)."""
    given = pick(setting, getattr(args, setting.name), os.environ)
    return given[0] if given else None


def _module_flag(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """What argparse left over: only ``train``'s ``-m``, once, before the program (after it, it is the program's)."""
    args.as_module = args.command == "train" and extras == [MODULE_FLAG]
    if extras and not args.as_module:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")


def _program_flags(args: argparse.Namespace) -> None:
    """A program typed torchrun's way (``script.py [args]``, ``-m pkg.mod [args]``) becomes the ``--script`` and
    ``--args`` flags it stands for: the arguments after the program are all of its arguments (none: none)."""
    if args.program is None:
        if getattr(args, "as_module", False):
            raise UserError("-m needs a module after it: multinode train -m pkg.train [its arguments]")
        return
    if args.script is not None:
        raise UserError(f"the program is given twice: --script {args.script} and {args.program}; "
                        f"drop --script or the program after the options")
    if args.args is not None and args.program_args:
        raise UserError(f"the arguments are given twice: --args {args.args!r} and after {args.program}; "
                        f"give them after the program only")
    args.script = f"-m {shlex.quote(args.program)}" if getattr(args, "as_module", False) else args.program
    if args.args is None:
        args.args = shlex.join(args.program_args)
    args.program, args.program_args, args.as_module = None, [], False  # folded: a second call finds nothing


def _settled(args: argparse.Namespace) -> Settled:
    """The train settings from their sources (flag > make variable > task file > default)."""
    _program_flags(args)
    flags = {name: getattr(args, name) for name in KEYS}
    workdir = flags["workdir"] if flags["workdir"] is not None else env_default("WORKDIR")
    task = find_task(_value(settings.TASK, args), workdir)
    for warning in task.warnings if task else ():
        print(f"multinode: {warning}", file=sys.stderr)
    return settle(flags, os.environ, task)


def _launch_spec(args: argparse.Namespace, settled: Settled | None = None) -> LaunchSpec:
    settled = settled or _settled(args)
    run = {name: _value(settings.find(settings.TRAIN, name), args) for name in ("run_id", "dry_run", "queue")}
    run["run_id"] = run["run_id"] or new_run_id()
    return settled.spec(os.environ, **run)


def _cluster_spec(args: argparse.Namespace) -> ClusterSpec:
    values = {s.name: _value(s, args) for s in settings.UP if s is not settings.YES}  # YES: an answer, not the spec
    scheduler = values.pop("scheduler")
    options = {**({"scheduler": scheduler} if scheduler else {}), **_options(args.option)}
    return ClusterSpec(name=args.cluster, options=options, **values)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "up":
        verbs.up(_cluster_spec(args), assume_yes=_value(settings.YES, args))
    elif args.command == "down":
        verbs.down(args.cluster, provider=_given(settings.find(settings.UP, "provider"), args),
                   yes=_value(settings.YES, args))
    elif args.command == "status":
        return verbs.status(args.cluster)
    elif args.command == "train":
        settled = _settled(args)
        named = _value(settings.find(settings.TRAIN, "run_id"), args) is not None  # RESUME=1 takes that run
        summary = verbs.train(args.cluster, _launch_spec(args, settled), settled=settled, named_run=named)
        return summary.exit_code if summary is not None else 0
    elif args.command == "logs":
        verbs.logs(args.cluster, run_id=_value(settings.RUN, args), node=_given(settings.NODE, args))
    elif args.command == "report":
        verbs.report(args.cluster, run_id=_value(settings.RUN, args))
    elif args.command == "stacks":
        return verbs.stacks(args.cluster, run_id=_value(settings.RUN, args))
    elif args.command == "preempt":
        print(verbs.preempt(args.cluster, _value(settings.NODE, args) or "1", _value(settings.IN, args),
                            _value(settings.NOTICE, args)))
    elif args.command == "netcheck":
        given = pick(settings.find(settings.UP, "nodes"), args.nodes, os.environ)  # unset: every node
        verbs.netcheck(args.cluster, given[0] if given else None)
    elif args.command == "ssh":
        return verbs.ssh(args.cluster, args.node, args.remote_command)
    elif args.command == "reap":
        region = _given(settings.find(settings.AWS, "region"), args)
        if not region:
            raise UserError("reap needs a region: make reap REGION=us-east-1 (add YES=1 to terminate what it finds)")
        verbs.reap(region, cluster=args.cluster if args.cluster != DEFAULT_CLUSTER else None,
                   yes=_value(settings.YES, args))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    logging.getLogger("paramiko").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        with Interrupts():
            return dispatch(args)
    except MultinodeError as err:
        print(f"multinode: {err}", file=sys.stderr)
        return err.exit_code
    except Interrupted as stop:
        print(f"multinode: {stop.message}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # a Ctrl-C before the handlers were in place
        print("multinode: interrupted", file=sys.stderr)
        return signal_exit(signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
