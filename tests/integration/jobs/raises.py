"""A user's script whose one rank raises: its traceback (with 3.11's carets) is also written to
``<--out>/traceback-rank<R>.txt``, exactly as Python prints it, so a test can compare what the log shows.

    raises.py --rank 1 --out DIR
"""

import argparse
import os
import sys
import time
import traceback

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--out", required=True)
args = parser.parse_args()
rank = int(os.environ["RANK"])


def keep_a_copy(kind, value, tb):
    with open(os.path.join(args.out, f"traceback-rank{rank}.txt"), "w") as fh:
        fh.write("".join(traceback.format_exception(kind, value, tb)))
    sys.__excepthook__(kind, value, tb)


sys.excepthook = keep_a_copy


def lookup(settings: dict, key: str) -> int:
    return settings[key] * len([1, 2, 3]) + settings.get("offset", 0)


def configure(name: str) -> int:
    return lookup({"lr": 1, "epochs": 2}, "missing-" + name + f"-rank{rank}")


print(f"RAISES rank={rank} pid={os.getpid()} starting", flush=True)
if rank == args.rank:
    configure("warmup")
time.sleep(30)  # the others wait to be stopped when the failed rank ends the job
