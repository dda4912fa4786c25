"""``python -m bench [--quick] [--out-dir docs] [--only NAME]`` (``make bench [QUICK=1]``): every section.

Brings up its own local cluster under a unique name (8 nodes; 2 in quick mode), runs the
collectives, launch-overhead and throughput sections on it, tears the cluster down, then the
control-plane section (a cluster of its own per node count: 8 to 64; 2 and 4 in quick mode) and
the MPI-vs-DDP section (one machine, no cluster) and the recovery section (fresh 3-node clusters), and writes ``benchmarks.json``, ``benchmarks.md`` and
the plots into ``--out-dir``. The spot day's replay (over an hour: ``python -m bench.spotday``) runs only when named
(``--only spotday``). A section that fails is reported and the others still run; the exit
code is then 1. Quick mode checks that everything runs and writes its files; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from bench import collectives, control_plane, launch, mpi_vs_ddp, recovery, spotday, throughput
from bench.nodes import bring_up
from bench.provenance import tree
from bench.report import DOCS, ORDER, began, publish

ON_CLUSTER = {"collectives": collectives, "launch": launch, "throughput": throughput}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short mode: checks each benchmark runs and writes its files")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    parser.add_argument("--only", action="append", choices=ORDER, help="run only this section (repeatable)")
    args = parser.parse_args(argv)
    tree()  # the checkout as it is before any section writes its files: every section's provenance
    wanted = [name for name in ORDER if not args.only or name in args.only]
    failed = []

    def section(name: str, fn, plot=None) -> None:
        start, stamp = time.monotonic(), began(settle=not args.quick)
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        try:
            result = fn()
        except Exception:  # report, keep going with the other sections
            traceback.print_exc()
            failed.append(name)
            return
        publish(name, result, args.quick, args.out_dir, plot, stamp)
        print(f"== {name} done in {time.monotonic() - start:.0f} s", flush=True)

    cluster_sections = [n for n in wanted if n in ON_CLUSTER]
    if cluster_sections:
        cluster = bring_up(2 if args.quick else 8, "bench")
        print(f"cluster {cluster.name} is up ({cluster.nodes} nodes, MULTINODE_HOME={cluster.home})", flush=True)
        try:
            for name in cluster_sections:
                module = ON_CLUSTER[name]
                section(name, lambda m=module: m.run(cluster, quick=args.quick), module.plot)
        finally:
            cluster.down()
            print(f"cluster {cluster.name} is down", flush=True)
    if "control_plane" in wanted:  # a cluster of its own per node count
        section("control_plane", lambda: control_plane.run(None, quick=args.quick), control_plane.plot)
    if "mpi_vs_ddp" in wanted:
        section("mpi_vs_ddp", lambda: mpi_vs_ddp.run(args.quick))
    if "recovery" in wanted:  # fresh 3-node clusters of its own, one per run
        section("recovery", lambda: recovery.run(None, quick=args.quick), recovery.plot)
    if args.only and "spotday" in args.only:  # fresh 4-node clusters of its own, one per method
        section("spotday", lambda: spotday.run(None, quick=args.quick), spotday.plot)
    if failed:
        print(f"failed sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
