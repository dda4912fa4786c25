"""Command line: parsing only. Everything it does is a call into :mod:`multinode.app.verbs`.

    multinode up     [--provider local|aws] [--nodes N] [--cluster-type cpu|g4dn|g4ad] [--mtu M] [-o key=value]
    multinode train  [--task multinode.yaml] [--mode cpu|gpu|mpi|mpi-gpu] [--nodes N] [--nproc P|auto]
                     [--script PATH|"-m pkg.mod"] [--args "..."] [--workdir DIR] [--setup "CMD"] [--env "NAME OTHER=value"]
                     [--launcher auto|torchrun|static] [--grace S] [--resume] [--recover N] [--recover-wait S]
                     [--dry-run]
    multinode down | status | logs [--run ID] [--node I] | stacks [--run ID] | ssh NODE [CMD...] | reap --region R [--yes]

Precedence: flag > environment (``MULTINODE_<NAME>``, which the Makefile sets from ``NODES=...``) > default;
for ``train``: flag > environment > task file (``WORKDIR/multinode.yaml`` or ``--task``) > default.
User errors print one line and exit 2; a failed job exits 1 and names the node and rank; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from multinode.app import verbs
from multinode.core.config import (
    CLUSTER_TYPES,
    DEFAULT_CLUSTER,
    DEFAULT_MTU,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_TRAIN_ARGS,
    MODES,
    ClusterSpec,
    LaunchSpec,
    env_default,
    new_run_id,
)
from multinode.core.errors import MultinodeError, UserError
from multinode.core.sources import Settled, settle
from multinode.core.taskfile import KEYS, TASK_FILE, find_task

log = logging.getLogger("multinode")


def _options(pairs: Sequence[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"option {pair!r} must look like key=value, e.g. -o region=us-east-1")
        options[key] = value
    return options


def _add_up(sub: argparse._SubParsersAction) -> None:
    """``up``: provision the cluster."""
    up = sub.add_parser("up", help="provision the cluster")
    up.add_argument("--provider", default=env_default("PROVIDER", "local"))
    up.add_argument("--nodes", type=int, default=env_default("NODES", "2"))
    up.add_argument("--cluster-type", default=env_default("CLUSTER_TYPE", "cpu"), help=f"one of {', '.join(CLUSTER_TYPES)}")
    up.add_argument("--mtu", type=int, default=env_default("MTU", str(DEFAULT_MTU)), help="local provider: link MTU")
    up.add_argument("--scheduler", default=env_default("SCHEDULER"), help="local provider: slurm (an embedded SLURM cluster)")
    up.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="provider option (aws: region, ssh_cidr, owner, ttl_hours, spot, ...)")
    up.add_argument("--yes", action="store_true", help="do not ask before creating billable resources")


def _add_down(sub: argparse._SubParsersAction) -> None:
    """``down``: destroy the cluster and verify nothing is left."""
    down = sub.add_parser("down", help="destroy the cluster and verify nothing is left")
    down.add_argument("--yes", action="store_true", help="also delete the cluster's image repository when it holds images")
    down.add_argument("--provider", default=env_default("PROVIDER"), help="only needed when the inventory is gone")


def _add_train(sub: argparse._SubParsersAction) -> None:
    """``train``: the job (MODE, nodes, processes, the script and its project, rendezvous, timeouts, launcher).
    The task's settings default to None here: :func:`multinode.core.sources.settle` picks flag > make variable
    > task file > default and knows which one it took."""
    train = sub.add_parser("train", help="run the training job on the cluster")
    train.add_argument("--task", default=env_default("TASK"), metavar="PATH",
                       help=f"task file with the settings below (default: WORKDIR/{TASK_FILE} if there is one)")
    train.add_argument("--mode", help=f"one of {', '.join(MODES)} (default cpu)")
    train.add_argument("--nodes", help="nodes taking part (default 2)")
    train.add_argument("--nproc", help="processes per node, or auto (one per GPU on GPU nodes, 1 on CPU nodes)")
    train.add_argument("--script", help="run this script (a path in WORKDIR) or '-m package.module' instead of our trainer")
    train.add_argument("--workdir", help="project directory synced to every node (default: SCRIPT's directory; '.' for -m)")
    train.add_argument("--workdir-limit-mb", help="refuse a WORKDIR larger than this (default 200)")
    train.add_argument("--setup", help="command run once per node in WORKDIR before the job, again when it or its files change")
    train.add_argument("--env", metavar='"NAME OTHER=value"',
                       help="variables for every rank; NAME alone takes your environment's value; values are never shown")
    train.add_argument("--args", help=f"arguments for the script, one string (default: {' '.join(DEFAULT_TRAIN_ARGS)})")
    train.add_argument("--rdzv-port", help="rendezvous port on node-0 (default 29500)")
    train.add_argument("--max-restarts", help="torchrun restarts per node (default 0)")
    train.add_argument("--elastic", metavar="MIN:MAX", help="elastic node range")
    train.add_argument("--rdzv-timeout", help="seconds a rendezvous waits for the nodes (default 60)")
    train.add_argument("--pg-timeout", help="seconds a collective waits for a dead peer (default 30)")
    train.add_argument("--deadline", help="seconds the job may take")
    train.add_argument("--stall-timeout", help="seconds without progress (step heartbeat, output, CPU) before the job "
                                               f"is ended naming the culprit; 0: off (default {DEFAULT_STALL_TIMEOUT})")
    train.add_argument("--skew", help="nodes whose Python/torch/NCCL/MPI or synced code differ: refuse (default) or warn")
    train.add_argument("--linkcheck", help="a node whose link is far slower than the others': refuse (default), warn, "
                                           "or off (docs/network.md)")
    train.add_argument("--grace", metavar="SECONDS", help="SIGTERM is a notice to the ranks (MULTINODE_GRACE): they "
                                                          "get this long to checkpoint before SIGKILL (docs/preemption.md)")
    train.add_argument("--resume", action="store_const", const="1",
                       help="continue the cluster's latest preempted or interrupted run (make train RESUME=1)")
    train.add_argument("--recover", metavar="N", help="recoveries allowed after losing nodes (default 0: off)")
    train.add_argument("--recover-wait", metavar="SECONDS",
                       help="seconds to wait for a replacement node before going on with fewer (default 120)")
    train.add_argument("--run-id", default=env_default("RUN_ID"))
    train.add_argument("--dry-run", action="store_true", help="print each node's command and environment, run nothing")
    train.add_argument("--queue", action="store_true", help="a cluster with a run in progress: wait for it to end "
                                                           "instead of being refused (make train QUEUE=1)")
    train.add_argument("--launcher", help="torchrun modes: static (no agents: faster start), torchrun (agents: elastic, "
                                          "restarts), or auto (default: torchrun only with ELASTIC or MAX_RESTARTS)")


def _add_logs(sub: argparse._SubParsersAction) -> None:
    """``logs``: a run's logs."""
    logs = sub.add_parser("logs", help="show a run's logs (default: the latest run)")
    logs.add_argument("--run", default=None, help="run id")
    logs.add_argument("--node", default=None, help="node index or name")


def _add_stacks(sub: argparse._SubParsersAction) -> None:
    """``stacks``: the Python stacks of a running job's ranks."""
    stacks = sub.add_parser("stacks", help="Python stacks of every rank of a running job, identical ones grouped")
    stacks.add_argument("--run", default=env_default("RUN"), help="run id (default: every run with live ranks)")


def _add_netcheck(sub: argparse._SubParsersAction) -> None:
    """``netcheck``: the cluster's links and collectives, measured on demand."""
    net = sub.add_parser("netcheck", help="node-to-node bandwidth (iperf3) and an all_reduce sweep, as tables and a plot")
    net.add_argument("--nodes", type=int, default=env_default("NODES"), help="how many nodes (default: all)")


def _add_preempt(sub: argparse._SubParsersAction) -> None:
    """``preempt``: a spot interruption notice on a local node, as EC2 sends one."""
    pre = sub.add_parser("preempt", help="arm a spot interruption notice on a local node (its metadata endpoint)")
    pre.add_argument("--node", default=env_default("NODE", "1"), help="node index or name (default 1)")
    pre.add_argument("--in", dest="in_seconds", type=float, default=env_default("IN", "0"),
                     help="seconds from now until the notice shows")


def _add_ssh(sub: argparse._SubParsersAction) -> None:
    """``ssh``: a shell (or a command) on a node."""
    ssh = sub.add_parser("ssh", help="open a shell on a node (pinned host key)")
    ssh.add_argument("node", nargs="?", default=env_default("NODE", "0"))
    ssh.add_argument("remote_command", nargs=argparse.REMAINDER)


def _add_reap(sub: argparse._SubParsersAction) -> None:
    """``reap``: leaked instances tagged by multinode."""
    reap = sub.add_parser("reap", help="find (and with --yes terminate) leaked instances tagged by multinode")
    reap.add_argument("--region", default=env_default("REGION"))
    reap.add_argument("--yes", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multinode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default=env_default("CLUSTER", DEFAULT_CLUSTER), help="cluster name (default %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_up(sub)
    _add_down(sub)
    sub.add_parser("status", help="show the nodes and whether each answers SSH")
    _add_train(sub)
    _add_logs(sub)
    _add_stacks(sub)
    _add_netcheck(sub)
    _add_preempt(sub)
    _add_ssh(sub)
    _add_reap(sub)
    return parser


def _settled(args: argparse.Namespace) -> Settled:
    """The train settings from their sources (flag > make variable > task file > default)."""
    flags = {name: getattr(args, name) for name in KEYS}
    workdir = flags["workdir"] if flags["workdir"] is not None else env_default("WORKDIR")
    return settle(flags, os.environ, find_task(args.task, workdir))


def _launch_spec(args: argparse.Namespace, settled: Settled | None = None) -> LaunchSpec:
    settled = settled or _settled(args)
    return settled.spec(os.environ, run_id=args.run_id or new_run_id(), dry_run=args.dry_run, queue=args.queue)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "up":
        spec = ClusterSpec(
            name=args.cluster, provider=args.provider, nodes=args.nodes,
            cluster_type=args.cluster_type, mtu=args.mtu,
            options={**({"scheduler": args.scheduler} if args.scheduler else {}), **_options(args.option)},
        )
        verbs.up(spec, assume_yes=args.yes)
    elif args.command == "down":
        verbs.down(args.cluster, provider=args.provider, yes=args.yes)
    elif args.command == "status":
        return verbs.status(args.cluster)
    elif args.command == "train":
        settled = _settled(args)
        summary = verbs.train(args.cluster, _launch_spec(args, settled), settled=settled)
        return summary.exit_code if summary is not None else 0
    elif args.command == "logs":
        verbs.logs(args.cluster, run_id=args.run, node=args.node)
    elif args.command == "stacks":
        return verbs.stacks(args.cluster, run_id=args.run)
    elif args.command == "preempt":
        print(verbs.preempt(args.cluster, args.node, args.in_seconds))
    elif args.command == "netcheck":
        verbs.netcheck(args.cluster, args.nodes)
    elif args.command == "ssh":
        return verbs.ssh(args.cluster, args.node, args.remote_command)
    elif args.command == "reap":
        if not args.region:
            raise UserError("reap needs a region: make reap REGION=us-east-1 (add YES=1 to terminate what it finds)")
        verbs.reap(args.region, cluster=args.cluster if args.cluster != DEFAULT_CLUSTER else None, yes=args.yes)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    logging.getLogger("paramiko").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return dispatch(args)
    except MultinodeError as err:
        print(f"multinode: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("multinode: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
