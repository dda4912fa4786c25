"""One rank fails fast while every other rank sleeps: the orchestrator must stop the sleepers.

    one_rank_exits.py [--fail-rank 11] [--code 3] [--sleep 300]

The failing rank prints ``FAIL rank=<r>`` and exits with ``--code``; the others print ``SLEEP rank=<r>``,
sleep ``--sleep`` seconds and print ``SLEPT rank=<r>`` (a line that must never appear when the run is
stopped). Standard library only; ranks come from the env:// variables (RANK, WORLD_SIZE).
"""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=11)
parser.add_argument("--code", type=int, default=3)
parser.add_argument("--sleep", type=float, default=300)
args = parser.parse_args()

rank = int(os.environ["RANK"])
if rank == args.fail_rank:
    sys.stdout.write(f"FAIL rank={rank} exit={args.code}\n")  # one write per line: ranks may share a pipe
    sys.stdout.flush()
    sys.exit(args.code)
sys.stdout.write(f"SLEEP rank={rank}\n")
sys.stdout.flush()
time.sleep(args.sleep)
sys.stdout.write(f"SLEPT rank={rank}\n")
