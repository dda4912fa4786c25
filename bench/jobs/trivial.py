"""The control-plane job: print this process's rank and the world size, exit 0.

Imports nothing but the standard library (no torch), so a run's time is the launcher's own:
start-up, SSH fan-out, code sync, process start and the end-of-run work. Every rank writes
``TRIVIAL <rank> <world size>`` as one line (one write: ranks may share a pipe).
"""

import os
import sys

sys.stdout.write(f"TRIVIAL {os.environ['RANK']} {os.environ['WORLD_SIZE']}\n")
sys.stdout.flush()
