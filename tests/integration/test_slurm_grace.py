"""GRACE through SLURM for real: an embedded 2-node cluster (munged, slurmctld, one slurmd per network-namespace node,
``KillWait=30``, SLURM's default and the runs' GRACE), a user script that knows nothing of notices behind the guard under srun + torchrun. A SIGTERM from
the scheduler -- ``scancel --signal=TERM`` on the login node, as a site's preemption notice or a user sends it, and
the orchestrator's own Ctrl-C, which with GRACE sends the same -- reaches every rank; each saves in its handler, the
batch task's prefixing pipeline outlives the signal (each rank's line after the SIGTERM still arrives), and
the run ends "preempted" (75), not failed. After every job the queue is empty and no process but the daemons is left.
Times are never asserted."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from localcluster import bring_up, tear_down

from bench.drills.common import RUN_BOUND, watched

pytestmark = pytest.mark.integration

EXIT_PREEMPTED = 75
DAEMONS = {"sshd", "munged", "slurmctld", "slurmd", "slurmscriptd"}
STEPS = 4000  # 0.05 s each: the notice always lands mid-run
PLAIN = (Path(__file__).parent / "jobs" / "plain_sigterm.py").read_text()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = bring_up(tmp_path_factory.mktemp("mnslurmgrace"), 2, prefix="s", options={"scheduler": "slurm"})
    try:
        yield cluster
    finally:
        tear_down(cluster)


def on_login(cluster, *argv: str) -> subprocess.CompletedProcess:
    ns = cluster.inventory().extra["namespaces"][0]
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)


def assert_nothing_left(cluster) -> None:
    from multinode.providers.local.faults import node_pids

    def leftovers() -> list[str]:
        found = []
        for node in cluster.inventory().nodes:
            for pid in node_pids(cluster.state, node.name):
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                if comm not in DAEMONS:
                    found.append(f"{node.name}: {pid} {comm}")
        return found

    end = time.monotonic() + 90  # a hang guard: the steps end in seconds; KillWait (30 s) is the scheduler's own bound
    while time.monotonic() < end and (on_login(cluster, "squeue", "-h").stdout.strip() or leftovers()):
        time.sleep(0.5)
    assert not on_login(cluster, "squeue", "-h").stdout.strip() and not leftovers(), leftovers()


def start(cluster, tmp_path: Path, run_id: str):
    project = tmp_path / "project"
    project.mkdir()
    (project / "plain.py").write_text(PLAIN)
    out = tmp_path / "ckpt"
    proc = cluster.popen("train", "--nodes", "2", f"--run-id={run_id}", "--script=plain.py", f"--workdir={project}",
                         "--grace=30", f"--args={out} {STEPS}")
    return proc, out


def assert_preempted(cluster, run_id: str, code: int, text: str, out: Path) -> None:
    assert code == EXIT_PREEMPTED, text[-4000:]
    for rank in (0, 1):
        assert 20 <= int(Path(f"{out}.rank{rank}").read_text()) < STEPS, text[-4000:]  # saved mid-run
        # the rank's line after the SIGTERM, through torchrun and the task's sed: the pipeline outlived the signal
        assert re.search(rf"\[node-{rank}\] \[rank{rank}\]: saved at step \d+", text), text[-4000:]
        assert f"[node-{rank}] multinode: node-{rank} exited with code 75 (preempted)" in text, text[-4000:]
    summary = json.loads((cluster.state.run_dir(run_id) / "summary.json").read_text())
    assert summary["exit_codes"] == {"node-0": EXIT_PREEMPTED, "node-1": EXIT_PREEMPTED}, summary["exit_codes"]
    assert f"run {run_id} PREEMPTED" in text, text[-4000:]


def test_a_scheduler_sigterm_to_the_job_ends_preempted_after_every_rank_saved(slurm, tmp_path):
    proc, out = start(slurm, tmp_path, "sgterm")
    with watched(proc) as (lines, err):
        lines.wait_for(r"\[node-1\] \[rank1\]: step 20 ", timeout=RUN_BOUND)
        job = re.search(r"submitted batch job (\d+)", "".join(lines.lines))[1]
        sent = on_login(slurm, "scancel", "--signal=TERM", job)
        assert sent.returncode == 0, sent.stderr
        code = proc.wait(timeout=RUN_BOUND)
    assert_preempted(slurm, "sgterm", code, "".join(lines.lines) + "".join(err.lines), out)
    assert_nothing_left(slurm)


def test_ctrl_c_to_the_orchestrator_with_grace_is_a_notice_through_the_scheduler(slurm, tmp_path):
    proc, out = start(slurm, tmp_path, "sgint")
    with watched(proc) as (lines, err):
        lines.wait_for(r"\[node-1\] \[rank1\]: step 20 ", timeout=RUN_BOUND)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(lines.lines) + "".join(err.lines)
    assert "SIGINT: a notice to every rank (scancel --signal=TERM; GRACE=30 s" in text, text[-4000:]
    assert_preempted(slurm, "sgint", code, text, out)
    assert_nothing_left(slurm)


def test_scancel_itself_gives_killwait_and_the_ranks_save_within_it(slurm, tmp_path):
    """``scancel <job>`` (what a preemption with PreemptMode=CANCEL sends too): SIGTERM to every step, SIGKILL after
    KillWait (30 s here, the run's GRACE: a site must give a checkpoint that long); the ranks save at once, and the run ends preempted though the scheduler says CANCELLED."""
    proc, out = start(slurm, tmp_path, "scancel")
    with watched(proc) as (lines, err):
        lines.wait_for(r"\[node-1\] \[rank1\]: step 20 ", timeout=RUN_BOUND)
        job = re.search(r"submitted batch job (\d+)", "".join(lines.lines))[1]
        sent = on_login(slurm, "scancel", job)
        assert sent.returncode == 0, sent.stderr
        code = proc.wait(timeout=RUN_BOUND)
    text = "".join(lines.lines) + "".join(err.lines)
    assert f"batch job {job}: CANCELLED" in text, text[-4000:]
    assert_preempted(slurm, "scancel", code, text, out)
    assert_nothing_left(slurm)
