"""Preemption on 3 real local nodes (sshd per node, torch, the metadata endpoint served inside each node):
the watcher reads the node's endpoint, a notice ends in one coordinated, replicated snapshot and exit 75
("preempted"), and the resume ends with an uninterrupted run's weights, bitwise. Times are recorded by
``bench/drills/preempt.py`` and never asserted (the stop inside the notice's two-minute window included)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from bench.drills.preempt import (resume, run_files, run_notice_drill, run_sigterm_drill,
                                  snapshot_copies, train_args)
from localcluster import REPO, preempt_project

pytestmark = pytest.mark.integration

EXIT_PREEMPTED = 75


def in_node(cluster, node: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """A process inside ``node``'s network namespace, our repository importable."""
    from multinode.providers.local.meta import net_plan, node_index

    ns = net_plan(cluster.state).netns(node_index(node))
    return subprocess.run(["ip", "netns", "exec", ns, "env", f"PYTHONPATH={REPO}",
                           *(f"{k}={v}" for k, v in env.items()), sys.executable, *argv],
                          capture_output=True, text=True, timeout=60)


def test_watcher_reads_the_local_metadata_endpoint(shared_cluster3):
    from multinode.providers.local.imds import ENDPOINT, WARNING_SECONDS, arm_notice, start_endpoint, stop_endpoint

    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": ENDPOINT}
    start_endpoint(shared_cluster3.state, "node-1")
    try:
        quiet = in_node(shared_cluster3, "node-1", "-m", "training.imds", **env)
        assert quiet.returncode == 0 and json.loads(quiet.stdout) is None, quiet.stdout + quiet.stderr
        notice = arm_notice(shared_cluster3.state, "node-1", 0.0)
        armed = in_node(shared_cluster3, "node-1", "-m", "training.imds", **env)
        got = json.loads(armed.stdout)
        assert got["kind"] == "interruption" and got["action"] == "terminate", armed.stdout + armed.stderr
        assert got["time"].endswith("Z") and notice["action_at"] - notice["visible_at"] == pytest.approx(WARNING_SECONDS)
        elsewhere = in_node(shared_cluster3, "node-2", "-m", "training.imds", **env)  # node-2 has no endpoint
        assert elsewhere.returncode == 1 and "imds:" in elsewhere.stderr, elsewhere.stderr
    finally:
        stop_endpoint(shared_cluster3.state, "node-1")
    assert not any(shared_cluster3.job_processes().values())


@pytest.fixture(scope="module")
def uninterrupted(shared_cluster3):
    res = shared_cluster3.cli(*train_args("base"), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return torch.load(run_files(shared_cluster3, "base", "final_model.pt")["node-0"])


def _assert_coordinated(result, node: str, ranks: int = 3) -> None:
    assert result.report is not None, result
    assert len(result.stops) == ranks and len(set(result.stops.values())) == 1, result.stops
    epoch, batch, step = next(iter(result.stops.values()))
    assert result.report["stopped_at"] == {"epoch": epoch, "batch": batch, "step": step}, result.report
    assert result.report["noticed_on"].endswith(node), result.report  # the host name: <cluster>-node-1
    hosts = {host for _rank, host, _path in result.report["copies"]}
    assert len(result.report["copies"]) == 2 and len(hosts) == 2, result.report  # on two nodes
    assert not any(result.left_at_exit.values()), result


def test_notice_on_node1_one_snapshot_replicated_then_bitwise_resume(shared_cluster3, uninterrupted):
    result = run_notice_drill(shared_cluster3, "spot")
    print(f"notice -> stopped+replicated {result.seconds_to_stop} s, -> exit {result.seconds_to_exit} s")
    assert result.exit_code == EXIT_PREEMPTED, result  # the orchestrator says "preempted", not "failed"
    _assert_coordinated(result, "node-1")
    assert result.report["notice"].startswith("spot interruption notice (terminate"), result.report
    copies = snapshot_copies(shared_cluster3, "spot")
    assert set(copies) == {"node-0:primary", "node-1:replica"}, copies
    assert copies["node-0:primary"].read_bytes() == copies["node-1:replica"].read_bytes()
    shutil.rmtree(copies["node-0:primary"].parent / "replica", ignore_errors=True)
    for name in ("snapshot.pt", "snapshot.sha256"):  # node-0's disk is lost: only node-1's copy is left
        (copies["node-0:primary"].parent / name).unlink()
    res = resume(shared_cluster3, "spot")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    epoch, batch, _ = next(iter(result.stops.values()))
    assert f"resumed from snapshot: next epoch {epoch} batch {batch}" in res.stdout, res.stdout[-3000:]
    assert float(res.stdout.split("test accuracy: ")[1].split()[0]) >= 0.95, res.stdout[-2000:]
    again = torch.load(run_files(shared_cluster3, "spot", "final_model.pt")["node-0"])
    assert all(torch.equal(uninterrupted[k], again[k]) for k in uninterrupted), "weights differ from the full run"


def test_sigterm_with_grace_checkpoints_before_exit(shared_cluster3):
    result = run_sigterm_drill(shared_cluster3, "term")
    print(f"SIGTERM -> stopped+replicated {result.seconds_to_stop} s, -> exit {result.seconds_to_exit} s")
    assert result.exit_code == EXIT_PREEMPTED, result
    _assert_coordinated(result, "node-1")
    assert result.report["notice"] == "SIGTERM (signal)", result.report
    assert len(snapshot_copies(shared_cluster3, "term")) == 2


def test_user_script_with_the_helper_checkpoints_on_sigterm(shared_cluster3, tmp_path):
    """tests/integration/jobs/user_preempt.py, a plain loop with ``preempt.guard()``, in a project that carries
    the helper (training/preempt.py and training/imds.py: standard library only, torch when it agrees)."""
    project = preempt_project(tmp_path)
    out = tmp_path / "user-ckpt.pt"
    args = ["train", "--nodes", "3", "--run-id=user", "--script=user_preempt.py", f"--workdir={project}",
            "--env=MULTINODE_GRACE=30", f"--args=--steps 100000 --out {out}"]
    result = run_sigterm_drill(shared_cluster3, "user", script=b"user_preempt.py", args=args)
    assert result.exit_code == EXIT_PREEMPTED, result
    assert len(result.stops) == 3 and len(set(result.stops.values())) == 1, result.stops
    assert torch.load(out)["step"] == next(iter(result.stops.values()))[2]
    assert not any(result.left_at_exit.values()), result


def _arm_when(started: Path, state, node: str, kind: str = "interruption") -> None:
    """Arm ``node``'s spot notice (``kind``) once ``started`` exists (the guarded command runs)."""
    from multinode.providers.local.imds import arm_notice

    for _ in range(600):
        if started.exists():
            break
        time.sleep(0.1)
    arm_notice(state, node, 0.0, kind=kind)


def test_guard_passes_a_notice_on_as_sigterm_and_ends_a_stubborn_command_75(shared_cluster3, tmp_path):
    """A command that does nothing about notices, under ``python -m training.guard`` inside node-2: the node's
    metadata notice -> SIGTERM to the command, which saves in its trap and exits 143 by its own choice, so the guard
    exits 143 (the command's own code, docs/preemption.md). A command that ignores SIGTERM is SIGKILLed after the
    grace and the guard exits 75."""
    from multinode.providers.local.imds import ENDPOINT, start_endpoint, stop_endpoint

    saved = tmp_path / "saved"
    # A foreground loop of short sleeps: a sleep forked after the guard's SIGTERM to the group cannot hold the
    # pipes for long; the notice is armed once the command runs, so its trap is set when the SIGTERM comes.
    command = f"trap 'echo saved > {saved}; exit 143' TERM; touch {saved}.started; while :; do sleep 0.2; done"
    start_endpoint(shared_cluster3.state, "node-2")
    armer = threading.Thread(target=_arm_when, args=(Path(f"{saved}.started"), shared_cluster3.state, "node-2"),
                             daemon=True)
    try:
        armer.start()
        res = in_node(shared_cluster3, "node-2", "-m", "training.guard", "--grace", "10", "--poll", "0.5", "--",
                      "sh", "-c", command, AWS_EC2_METADATA_SERVICE_ENDPOINT=ENDPOINT)
    finally:
        stop_endpoint(shared_cluster3.state, "node-2")
    assert res.returncode == 143 and saved.read_text() == "saved\n", res.stderr
    assert "spot interruption notice (terminate" in res.stderr
    stubborn = in_node(shared_cluster3, "node-0", "-m", "training.guard", "--grace", "1", "--poll", "0.5", "--",
                       "sh", "-c", "trap '' TERM; kill -TERM $PPID; sleep 120")
    assert stubborn.returncode == EXIT_PREEMPTED, stubborn.stderr  # its own SIGTERM, then SIGKILL after 1 s


def test_make_preempt_ends_the_run_preempted_not_failed(shared_cluster3):
    """`make preempt NODE=1` on a run whose ranks read the local metadata endpoint: the run stops at one step and
    the orchestrator ends it with 75 and the PREEMPTED summary."""
    from bench.drills.common import watched
    from multinode.providers.local.imds import stop_endpoint

    from multinode.providers.local.imds import ENDPOINT

    proc = shared_cluster3.popen("train", "--nodes", "3", "--run-id=mkpre",
                                 f"--env=AWS_EC2_METADATA_SERVICE_ENDPOINT={ENDPOINT}",
                                 "--args=--workload digits 40 40")
    try:
        with watched(proc) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 1/40 ", timeout=240)
            armed = shared_cluster3.cli("preempt", "--node", "1", timeout=60)
            assert armed.returncode == 0 and "node-1: spot interruption notice" in armed.stdout, armed.stderr
            code = proc.wait(timeout=240)
        text = "".join(out.lines)
        assert code == EXIT_PREEMPTED, text[-3000:] + "".join(err.lines)[-3000:]
        assert "run mkpre PREEMPTED" in text and "resume: " in text and "--run-id mkpre" in text, text[-3000:]
        summary = json.loads((shared_cluster3.state.run_dir("mkpre") / "summary.json").read_text())
        assert summary["preempted"]["noticed_on"].endswith("node-1") and len(summary["preempted"]["copies"]) == 2
        assert summary["failed_node"] is None
    finally:
        stop_endpoint(shared_cluster3.state, "node-1")
    assert not any(shared_cluster3.job_processes().values())


def test_make_preempt_rebalance_saves_once_and_the_run_goes_on(shared_cluster3, uninterrupted):
    """`make preempt NODE=1 NOTICE=rebalance` mid-run, with RECOVER=1 (a stop would be recovered): every rank takes one
    coordinated checkpoint at the same step and training goes on -- no PREEMPTED, no recovery, node-1 not replaced
    (its metadata endpoint is the same process) -- and the run ends 0 with the uninterrupted run's weights, bitwise."""
    from bench.drills.common import watched
    from multinode.providers.local.imds import endpoint_pid, start_endpoint, stop_endpoint

    start_endpoint(shared_cluster3.state, "node-1")
    endpoint = endpoint_pid(shared_cluster3.state, "node-1")
    proc = shared_cluster3.popen(*train_args("rebal"), "--recover=1")
    try:
        with watched(proc) as (out, err):
            out.wait_for(r"\[rank0\]: .*epoch 2/", timeout=240)
            armed = shared_cluster3.cli("preempt", "--node", "1", "--notice", "rebalance", timeout=60)
            assert armed.returncode == 0 and "node-1: rebalance recommendation at" in armed.stdout, armed.stderr
            code = proc.wait(timeout=400)
        text = "".join(out.lines)
        assert code == 0, text[-3000:] + "".join(err.lines)[-3000:]
        saves = [line for line in out.lines if "one coordinated checkpoint at epoch" in line]
        assert len(saves) == 1 and "rebalance recommendation" in saves[0] and "node-1" in saves[0], saves
        assert "PREEMPTED" not in text and "[recover]" not in text, text[-3000:]
        assert endpoint_pid(shared_cluster3.state, "node-1") == endpoint  # node-1 was not replaced
        summary = json.loads((shared_cluster3.state.run_dir("rebal") / "summary.json").read_text())
        assert summary["exit_code"] == 0 and not summary.get("recovery") and not summary.get("preempted"), summary
        assert float(text.split("test accuracy: ")[1].split()[0]) >= 0.95, text[-2000:]
    finally:
        stop_endpoint(shared_cluster3.state, "node-1")
    again = torch.load(run_files(shared_cluster3, "rebal", "final_model.pt")["node-0"])
    assert all(torch.equal(uninterrupted[k], again[k]) for k in uninterrupted), "weights differ from the full run"
    assert not any(shared_cluster3.job_processes().values())


def test_guard_does_not_signal_a_command_on_a_rebalance_and_ignores_an_older_notice(shared_cluster3, tmp_path):
    """A command behind ``python -m training.guard`` in node-2: a rebalance recommendation armed while it runs is said
    in one line and the command runs on to its own end (no SIGTERM: its trap would write the file); a recommendation
    armed before the guard started is older than its run: said once, ignored."""
    from multinode.providers.local.imds import ENDPOINT, arm_notice, start_endpoint, stop_endpoint

    saved = tmp_path / "saved"
    command = f"trap 'echo term > {saved}; exit 143' TERM; touch {saved}.started; i=0; " \
              f"while [ $i -lt 40 ]; do sleep 0.2; i=$((i+1)); done"
    guard = ("-m", "training.guard", "--grace", "10", "--poll", "0.5", "--", "sh", "-c", command)
    start_endpoint(shared_cluster3.state, "node-2")
    try:
        arm_notice(shared_cluster3.state, "node-2", 0.0, kind="rebalance")
        time.sleep(2.0)  # the recommendation's time (whole seconds) is now before the guard's start
        older = in_node(shared_cluster3, "node-2", *guard, AWS_EC2_METADATA_SERVICE_ENDPOINT=ENDPOINT)
        assert older.returncode == 0 and not saved.exists(), older.stderr
        assert older.stderr.count("older than this run") == 1 and "goes on" not in older.stderr, older.stderr
        Path(f"{saved}.started").unlink()
        stop_endpoint(shared_cluster3.state, "node-2")  # forget it
        start_endpoint(shared_cluster3.state, "node-2")
        armer = threading.Thread(target=_arm_when, args=(Path(f"{saved}.started"), shared_cluster3.state, "node-2",
                                                         "rebalance"), daemon=True)
        armer.start()
        fresh = in_node(shared_cluster3, "node-2", *guard, AWS_EC2_METADATA_SERVICE_ENDPOINT=ENDPOINT)
    finally:
        stop_endpoint(shared_cluster3.state, "node-2")
    assert fresh.returncode == 0 and not saved.exists(), fresh.stderr
    assert fresh.stderr.count("rebalance recommendation") == 1 and "the job goes on" in fresh.stderr, fresh.stderr
    assert "SIGTERM to the job" not in fresh.stderr, fresh.stderr
