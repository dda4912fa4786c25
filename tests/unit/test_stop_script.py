"""The stop script the sweep and the gang-stop run on each node, on real processes of this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

from multinode.ssh.runner import STOP_SCRIPT


def stop(run_id: str) -> str:
    res = subprocess.run(["sh", "-c", STOP_SCRIPT, "stop", run_id, "30"], capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_it_stops_every_process_of_its_run_and_nothing_else():
    run, other = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    ours = [subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": run}) for _ in range(3)]
    paused = subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": run})
    paused.send_signal(signal.SIGSTOP)  # acts on the TERM only once continued
    theirs = subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": other})
    try:
        time.sleep(0.1)
        assert stop(run) == "stopped 4"
        assert [p.wait(5) for p in ours + [paused]] == [-signal.SIGTERM] * 4
        assert theirs.poll() is None
        assert stop(run) == "stopped 0"
    finally:
        for p in ours + [paused, theirs]:
            p.kill()
            p.wait()
