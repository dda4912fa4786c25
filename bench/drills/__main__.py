"""``python -m bench.drills [--out docs/reliability.md] [--only NAME]``: every drill on one 3-node local
cluster (brought up and down here), results written as docs/reliability.md (see :mod:`bench.drills`)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import bench.drills
from bench.drills import page
from bench.drills.common import REPO
from bench.drills.crashes import DRILLS, PRESTART_DRILLS, run_drill, run_prestart_drill
from bench.drills.elastic import ELASTIC_DRILLS, run_elastic_drill
from bench.drills.hangs import HANG_DRILLS, run_hang_drill
from bench.drills.preempt import PREEMPT_DRILLS, preempt_markdown, run_preempt_drill
from bench.drills.stragglers import STRAGGLER_DRILLS, run_straggler_drill
from bench.provenance import began, machine


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.drills", description=bench.drills.__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--only", action="append", help="run only drills whose name contains this")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from localcluster import bring_up, tear_down

    where = {**began(settle=True), **machine()}  # the checkout and the load as the drills begin (settled)

    with tempfile.TemporaryDirectory() as home:
        cluster = bring_up(Path(home), 3, prefix="drill")
        try:
            def run_each(drills, run) -> list:
                done = []
                for name in drills:
                    if not args.only or any(part in name for part in args.only):
                        done.append(run(cluster, name))
                        print(f"{name}: {done[-1]}", flush=True)
                return done

            results = run_each(DRILLS, run_drill) + run_each(PRESTART_DRILLS, run_prestart_drill)
            elastic = run_each(ELASTIC_DRILLS, run_elastic_drill)
            hangs = run_each(HANG_DRILLS, run_hang_drill)
            preempted = run_each(PREEMPT_DRILLS, run_preempt_drill)
            stragglers = run_each(STRAGGLER_DRILLS, lambda c, name: run_straggler_drill(c, STRAGGLER_DRILLS[name]))
        finally:
            tear_down(cluster)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page.markdown(results, elastic, where) + page.hangs_markdown(hangs, where)
                        + preempt_markdown(preempted) + page.stragglers_markdown(stragglers))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
