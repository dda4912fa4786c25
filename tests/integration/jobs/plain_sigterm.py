"""A script that knows nothing of notices: ``plain_sigterm.py OUT STEPS``. It steps every 0.05 s and, on SIGTERM,
writes the step it reached to ``OUT.rank<RANK>``, says so, and dies of the signal as an unhandled SIGTERM would
(the guard and the schedulers judge it by that)."""
import os
import signal
import sys
import time

rank, out = int(os.environ["RANK"]), sys.argv[1]
step = 0


def on_term(signum, frame):
    with open(f"{out}.rank{rank}", "w") as fh:
        fh.write(str(step))
    print(f"saved at step {step}", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


signal.signal(signal.SIGTERM, on_term)
for step in range(1, int(sys.argv[2]) + 1):
    time.sleep(0.05)
    if step % 20 == 0:
        print(f"step {step} ", flush=True)
