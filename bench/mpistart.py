"""``python -m bench.mpistart [--rounds N] [--busy K]``: the SLURM MPI start-up SIGSEGV (docs/verification.md, SLURM)
measured. On an embedded 3-node SLURM cluster, ``bench/jobs/mpi_first_steps.py`` (the trainer's first MPI steps) runs
as ``srun --mpi=pmix --kill-on-bad-exit=1`` jobs, one rank a node, under K busy processes; Open MPI's defaults and
:data:`multinode.plan.launchers.mpirun.DIRECT_MODEX` alternate job by job (N rounds of one job each, the first of a
round alternating). Prints each setting's jobs, failed jobs, the ones a rank's SIGSEGV ended, and the median job."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multinode.plan.launchers.mpirun import DIRECT_MODEX, tcp_env

REPO = Path(__file__).resolve().parents[1]
STEPS = REPO / "bench" / "jobs" / "mpi_first_steps.py"
SETTINGS = {"Open MPI's defaults": {}, "DIRECT_MODEX": DIRECT_MODEX}


def one_job(namespace: str, subnet: str, extra: dict[str, str]) -> tuple[int, float, bool]:
    """One srun job: its exit code, its seconds, whether a rank died of SIGSEGV."""
    env = {**os.environ, **tcp_env(subnet), **extra}  # the ranks' environment as the sbatch script gives it
    argv = ["ip", "netns", "exec", namespace, "srun", "--mpi=pmix", "-N3", "-n3", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", sys.executable, str(STEPS)]
    began = time.monotonic()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    return res.returncode, time.monotonic() - began, "Segmentation fault" in res.stdout + res.stderr


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mpistart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=450)
    parser.add_argument("--busy", type=int, default=6, help="busy processes beside the jobs (the load)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from localcluster import bring_up, tear_down

    done: dict[str, list[tuple[int, float, bool]]] = {name: [] for name in SETTINGS}
    loads = []
    with tempfile.TemporaryDirectory() as home:
        cluster = bring_up(Path(home), 3, prefix="mps", options={"scheduler": "slurm"})
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            inv = cluster.inventory()
            login = inv.extra["namespaces"][0]
            for i in range(args.rounds):
                for name in (list(SETTINGS) if i % 2 == 0 else list(SETTINGS)[::-1]):
                    done[name].append(one_job(login, inv.subnet, SETTINGS[name]))
                loads.append(os.getloadavg()[0])
        finally:
            for proc in busy:
                proc.kill()
            tear_down(cluster)
    print(f"{args.rounds} rounds, {args.busy} busy processes, load {min(loads):.1f}-{max(loads):.1f}")
    for name, jobs in done.items():
        ok = [seconds for code, seconds, _ in jobs if code == 0]
        print(f"{name}: {len(jobs)} jobs, {len(jobs) - len(ok)} failed, {sum(s for *_, s in jobs)} by a SIGSEGV, "
              f"median job {statistics.median(ok) if ok else float('nan'):.2f} s")


if __name__ == "__main__":
    main()
