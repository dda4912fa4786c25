"""GRACE on 3 real local nodes (sshd per node, torch): ``--grace`` alone (no ENV) makes SIGTERM a notice for every
rank, so a SIGTERM to one rank, or Ctrl-C to the orchestrator itself, ends in one coordinated, replicated
checkpoint and exit 75 ("preempted"); a user script using ``training.preempt.guard()`` does the same behind
the notice guard (``training/guard.py``, synced to each node); under torchrun with restarts left, a preempted
worker is not restarted. After each run nothing of it is left on any node. Times are never asserted."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from bench.drills.common import PG_TIMEOUT, RUN_BOUND, watched
from bench.drills.preempt import run_sigterm_drill, snapshot_copies
from localcluster import preempt_project

pytestmark = pytest.mark.integration

EXIT_PREEMPTED = 75
GRACE = "30"
EPOCH_2 = r"\[rank0\]: (\[rank 0\] )?epoch 2/"


def grace_args(run_id: str, *extra: str, grace: str = GRACE) -> list[str]:
    return ["train", "--nodes", "3", f"--run-id={run_id}", f"--pg-timeout={PG_TIMEOUT}", f"--grace={grace}",
            "--args=--workload digits 40 4", *extra]


def summary_of(cluster, run_id: str) -> dict:
    return json.loads((cluster.state.run_dir(run_id) / "summary.json").read_text())


def assert_one_checkpoint(result, node: str | None) -> None:
    assert result.exit_code == EXIT_PREEMPTED, result
    assert result.report is not None and len(result.stops) == 3 and len(set(result.stops.values())) == 1, result
    if node is not None:
        assert result.report["noticed_on"].endswith(node), result.report
    assert len({host for _rank, host, _path in result.report["copies"]}) == 2, result.report
    assert not any(result.left_at_exit.values()), result


def test_grace_makes_sigterm_to_a_rank_one_checkpoint_and_75(shared_cluster3):
    result = run_sigterm_drill(shared_cluster3, "gterm", args=grace_args("gterm"))
    assert_one_checkpoint(result, "node-1")
    assert result.report["notice"] == "SIGTERM (signal)", result.report
    assert len(snapshot_copies(shared_cluster3, "gterm")) == 2
    assert summary_of(shared_cluster3, "gterm")["preempted"] is not None
    for log in shared_cluster3.state.run_dir("gterm").glob("node-*.log"):  # a preempted rank is no failure's root cause
        assert "Root Cause" not in log.read_text(), log


def test_grace_puts_a_user_script_with_the_helper_behind_the_guard(shared_cluster3, tmp_path):
    """tests/integration/jobs/user_preempt.py (``preempt.guard()``) with ``--grace`` and no ENV: every rank has
    MULTINODE_GRACE, runs behind the node's synced guard, and all stop at one step and save."""
    project = preempt_project(tmp_path)
    out = tmp_path / "user-ckpt.pt"
    args = ["train", "--nodes", "3", "--run-id=guser", "--script=user_preempt.py", f"--workdir={project}",
            f"--grace={GRACE}", f"--args=--steps 100000 --out {out}"]
    result = run_sigterm_drill(shared_cluster3, "guser", script=b"user_preempt.py", args=args)
    assert result.exit_code == EXIT_PREEMPTED, result
    assert len(result.stops) == 3 and len(set(result.stops.values())) == 1, result.stops
    assert torch.load(out)["step"] == next(iter(result.stops.values()))[2]
    plan = json.loads((shared_cluster3.state.run_dir("guser") / "plan.json").read_text())
    guarded = [any(a.endswith("/code/guard/guard.py") for a in cmd["argv"]) for cmd in plan["commands"]]
    assert all(guarded) and all(cmd["env"]["MULTINODE_GRACE"] == GRACE for cmd in plan["commands"])
    assert not any(result.left_at_exit.values()), result


def test_ctrl_c_to_the_orchestrator_with_grace_is_a_notice_to_every_rank(shared_cluster3):
    proc = shared_cluster3.popen(*grace_args("gint"))
    with watched(proc) as (out, err):
        out.wait_for(EPOCH_2, timeout=RUN_BOUND)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(out.lines) + "".join(err.lines)
    assert code == EXIT_PREEMPTED, text[-4000:]
    assert "SIGINT: a notice to every rank" in text and "run gint PREEMPTED" in text, text[-4000:]
    summary = summary_of(shared_cluster3, "gint")
    assert summary["preempted"]["notice"] == "SIGTERM (signal)" and len(summary["preempted"]["copies"]) == 2, summary
    assert set(summary["exit_codes"].values()) == {EXIT_PREEMPTED}, summary
    assert not any(shared_cluster3.job_processes().values())


def test_torchrun_with_restarts_left_does_not_restart_a_preempted_worker(shared_cluster3):
    args = grace_args("gtorch", "--launcher=torchrun", "--max-restarts=1")
    result = run_sigterm_drill(shared_cluster3, "gtorch", args=args)
    # The agent keeps each attempt's worker logs in <log-dir>/<run>/attempt_<n>/ (--log-dir, torch 2.13): a restart
    # would have made attempt_1 on some node.
    attempts = {path.name for path in Path(shared_cluster3.home).glob("**/runs/gtorch/torchrun/*/attempt_*")}
    assert attempts == {"attempt_0"}, attempts
    assert_one_checkpoint(result, None)
    assert set(summary_of(shared_cluster3, "gtorch")["exit_codes"].values()) == {EXIT_PREEMPTED}


def test_mpirun_with_grace_ends_preempted_on_a_sigterm_to_one_rank(shared_cluster3):
    """MODE=mpi: every rank has MULTINODE_GRACE from its app context; mpirun (which aborts the job when a rank exits
    non-zero) ends with the ranks' 75. Our trainer keeps mpirun's 1 s odls_base_sigkill_timeout (its ranks exit 75
    only after the whole checkpoint; with it at GRACE=30 mpirun ended 120 s after them: the launcher's module doc)."""
    result = run_sigterm_drill(shared_cluster3, "gmpi", args=grace_args("gmpi", "--mode=mpi"))
    assert_one_checkpoint(result, "node-1")
    assert summary_of(shared_cluster3, "gmpi")["preempted"] is not None
