"""A resize for real, as local processes (``train.py --spawn``, no launcher, no cluster): 3 ranks are stopped
mid-run by a notice (SIGTERM to one rank with MULTINODE_GRACE: every rank stops after the same step, one
snapshot, exit 75), then the run resumes on 2 ranks. The global batch stays what it was (the trainer's own
lines), every sample index is trained exactly once per epoch across both runs (``samples.jsonl`` from
``--log-samples``), and the run ends >= 95% on digits."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from training.config import load
from training.workloads import build

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "training" / "train.py")
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("MULTINODE_", "OMPI_", "PMI", "SLURM_"))},
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
EPOCHS = "10"
EXIT_PREEMPTED = 75


class Run:
    """``train.py --spawn N ...`` in its own process group, its output collected line by line."""

    def __init__(self, ranks: int, run_dir: Path, **env: str):
        argv = [sys.executable, TRAIN, "--spawn", str(ranks), "--workload", "digits", EPOCHS, EPOCHS,
                "--snapshot-dir", str(run_dir / "snap"), "--metrics-dir", str(run_dir), "--log-samples"]
        self.proc = subprocess.Popen(argv, env={**ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            if self.proc.poll() is not None or time.monotonic() > deadline:  # a hang becomes a failure
                pytest.fail(f"no {pattern!r} in:\n{self.text[-3000:]}")
            time.sleep(0.05)

    def ranks(self) -> list[int]:
        """The rank processes (mp.spawn's children, in the order they were started)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return sorted(int(pid) for pid in children
                      if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes())

    def finish(self, timeout: float = 240) -> int:
        """The run's exit code. Nothing of its process group may outlive it: what is left fails the test, named,
        and is killed once that is recorded (a process that is exiting gets a moment to go)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        settle = time.monotonic() + 5
        while self.left() and time.monotonic() < settle:
            time.sleep(0.05)
        left = self.left()
        self.kill()
        self.reader.join(timeout=10)
        if left:
            pytest.fail(f"left in the run's process group after it exited (killed now): {left}", pytrace=False)
        return code

    def left(self) -> list[str]:
        """'<pid> (<name>)' of each live process of the run's process group (the run's own pid: a new session)."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
            if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == self.proc.pid:
                found.append(f"{entry.name} ({stat[stat.find('(') + 1:stat.rfind(')')]})")
        return found

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # cleanup: what is left was recorded by finish()
        except ProcessLookupError:
            pass

    def line(self, prefix: str) -> dict:
        found = [ln.split(prefix, 1)[1] for ln in self.text.splitlines() if prefix in ln]
        assert len(found) == 1, self.text[-3000:]
        return json.loads(found[0])


def test_three_ranks_stopped_mid_run_go_on_as_two_with_the_same_global_batch(tmp_path):
    first = Run(3, tmp_path, MULTINODE_GRACE="60")
    try:
        first.wait_for(r"epoch 1/", timeout=120)
        ranks = first.ranks()
        assert len(ranks) == 3, ranks
        os.kill(ranks[1], signal.SIGTERM)  # a notice on one rank; the agreement stops all three
    finally:
        code = first.finish()
    assert code == EXIT_PREEMPTED, first.text[-3000:]
    assert "global batch 96 = 3 ranks x 32 samples (1 micro-batches of up to 32)" in first.text
    stopped = first.line("PREEMPTED ")["stopped_at"]

    second = Run(2, tmp_path)
    assert second.finish() == 0, second.text[-3000:]
    resumed = second.line("RESUMED ")
    assert (resumed["world_size_before"], resumed["world_size"], resumed["global_batch"]) == (3, 2, 96)
    assert (resumed["accum"], resumed["micro_batch"], resumed["step"]) == (2, 24, stopped["step"])
    assert resumed["epoch"] == stopped["epoch"] and resumed["consumed"] > 0
    assert "global batch 96 = 2 ranks x 48 samples (2 micro-batches of up to 24)" in second.text
    result = second.line("RESULT ")
    print(f"stopped at {stopped}, resumed {resumed}, test accuracy {result['test_accuracy']}")
    assert result["global_batch"] == 96 and result["world_size"] == 2 and result["test_accuracy"] >= 0.95

    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))  # each step once, across the resize
    train_size = len(build(load(["--workload", "digits"]).training).train)
    for epoch in range(int(EPOCHS)):
        ids = [i for r in rows if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(train_size)), f"epoch {epoch}: not every sample exactly once"
    resumed_epoch = [r for r in rows if r["epoch"] == stopped["epoch"]]
    assert {len(r["ids"]) for r in resumed_epoch[:-1]} == {96}  # full steps of 96 before and after the resize
