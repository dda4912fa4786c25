"""SLURM for real: an embedded 3-node cluster (munged, slurmctld, one slurmd per network-namespace
node; `make up SCHEDULER=slurm`) driven through the CLI exactly as `make` does.

One cluster for the module: `status` shows sinfo; digits >= 95% through sbatch in MODE=cpu (srun +
torchrun, c10d on the allocation's first host) and MODE=mpi (srun --mpi=pmix); the DRY_RUN=1 script
submitted by hand with sbatch on the login node; the same cluster described as an existing one
(PROVIDER=hosts: its login node, a shared work directory); a killed rank and Ctrl-C cancel the batch job.
After every job: the scheduler's queue is empty and no process but the daemons is left on any node;
after `down`, nothing of the cluster (the daemons and the munge socket directory included)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from localcluster import REPO, Cluster, another_torch, bring_up, new_cluster_name, tear_down

pytestmark = pytest.mark.integration

DAEMONS = {"sshd", "munged", "slurmctld", "slurmd", "slurmscriptd"}
DIGITS = "--workload digits 10 5"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = bring_up(tmp_path_factory.mktemp("mnslurm"), 3, prefix="s", options={"scheduler": "slurm"})
    try:
        yield cluster
    finally:
        tear_down(cluster)


def squeue(cluster) -> list[str]:
    ns = cluster.inventory().extra["namespaces"][0]
    res = subprocess.run(["ip", "netns", "exec", ns, "squeue", "-h"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def leftovers(cluster) -> dict[str, list[str]]:
    """Processes on each node other than sshd and the SLURM/munge daemons."""
    from multinode.providers.local.faults import node_pids

    found = {}
    for node in cluster.inventory().nodes:
        names = []
        for pid in node_pids(cluster.state, node.name):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm not in DAEMONS:
                names.append(f"{pid} {comm}")
        found[node.name] = names
    return found


def assert_nothing_left(cluster) -> None:
    end = time.monotonic() + 90  # a hang guard: the steps end in seconds; KillWait (30 s) is the scheduler's own bound
    while time.monotonic() < end and (squeue(cluster) or any(leftovers(cluster).values())):
        time.sleep(0.5)
    assert squeue(cluster) == [] and not any(leftovers(cluster).values()), (squeue(cluster), leftovers(cluster))


def result_of(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if "RESULT {" in line)
    return json.loads(line[line.index("{"):])


def test_status_cpu_mpi_and_a_hand_submitted_script_reach_95(slurm):
    status = slurm.cli("status", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    for i in range(3):
        assert re.search(rf"{slurm.name}-node-{i} batch\* idle", status.stdout), status.stdout

    for mode, launcher, launch in (("cpu", "torchrun", "srun + torchrun"), ("mpi", "mpirun", "srun --mpi=pmix")):
        verbose = ("--env", "OMPI_MCA_pmix_base_verbose=1") if mode == "mpi" else ()
        res = slurm.cli("train", "--nodes", "3", "--mode", mode, "--args", DIGITS, *verbose, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        job = re.search(r"submitted batch job (\d+) \(run \S+\); output (\S+)/slurm-\d+\.out", res.stdout)
        assert job and f"batch job {job[1]}: COMPLETED, exit code 0" in res.stdout, res.stdout[-2000:]
        # The path the docs claim (docs/slurm.md, verification.md): MODE=mpi's ranks are srun's tasks under PMIx, not
        # an mpirun inside the allocation (what a cluster without the plugin falls back to, and says so).
        assert f"through SLURM ({launch})" in res.stdout, res.stdout[:2000]
        tasks = (Path(job[2]) / "job.sbatch").read_text().strip().splitlines()[-1]
        assert tasks.startswith(launch.split(" + ")[0] + (" " if mode == "mpi" else " --nodes=")), tasks
        assert "mpirun" not in (Path(job[2]) / "job.sbatch").read_text(), tasks
        result = result_of(res.stdout)
        assert result["launcher"] == launcher and result["world_size"] == 3 and result["test_accuracy"] >= 0.95
        # Rank 0 speaks, the trainer's other ranks only warn (every node's ranks streamed with both prefixes: the
        # project test below, whose every rank prints).
        assert re.search(r"^\[node-0\] \[rank0\]", res.stdout, re.M), res.stdout[-2000:]
        if mode == "mpi":  # two PMIx fences a rank, MPI_Init's barrier and MPI_Finalize's: not the data exchange
            # before the handlers are set, the start-up SIGSEGV's window (multinode.plan.launchers.mpirun.DIRECT_MODEX;
            # with Open MPI's defaults, three)
            fences = re.findall(r"^\[(node-\d)\] \[rank\d\] \[\S+\] PMIx_client fencenb$", res.stdout, re.M)
            assert sorted(fences) == [f"node-{i}" for i in range(3) for _ in range(2)], fences
        assert_nothing_left(slurm)

    # DRY_RUN=1 prints the script; a user saves it next to the run on the login node and submits it.
    dry = slurm.cli("train", "--nodes", "3", "--mode", "cpu", "--args", DIGITS, "--dry-run", timeout=60)
    assert dry.returncode == 0 and dry.stdout.startswith("#!/bin/bash\n"), dry.stdout + dry.stderr
    script_path = re.search(r"^# Submit by hand on the login node: sbatch (\S+)$", dry.stdout, re.M)[1]
    assert subprocess.run(["bash", "-n"], input=dry.stdout, text=True).returncode == 0
    Path(script_path).parent.mkdir(parents=True)
    Path(script_path).write_text(dry.stdout)
    by_hand = slurm.cli("ssh", "0", "sbatch", "--wait", "--parsable", script_path, timeout=600)
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    job_id = by_hand.stdout.split()[0].split(";")[0]
    output = (Path(script_path).parent / f"slurm-{job_id}.out").read_text()
    assert f"multinode: batch job {job_id} on" in output
    result = result_of(output)
    assert result["launcher"] == "torchrun" and result["world_size"] == 3 and result["test_accuracy"] >= 0.95
    assert_nothing_left(slurm)


def _wait_for(stream_lines: list[str], pattern: str, proc: subprocess.Popen, deadline: float) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end and proc.poll() is None:
        if any(re.search(pattern, line) for line in list(stream_lines)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in {deadline} s: {stream_lines[-20:]}")


def _start(slurm, mode: str) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    """The CLI with stdout and stderr in one pipe, read line by line as it runs."""
    proc = subprocess.Popen([sys.executable, "-m", "multinode", "train", "--nodes", "3", "--mode", mode,
                             "--args", "--workload digits 60 5"], cwd=REPO, env=slurm.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, lines, reader


def _finish(proc: subprocess.Popen, lines: list[str], reader: threading.Thread) -> str:
    proc.wait(timeout=120)
    reader.join(timeout=30)
    return "".join(lines)


def test_an_env_script_runs_in_the_mpi_step(slurm):
    """MODE=mpi through the scheduler: each MPI rank gets torch's env:// contract too (RANK etc. from the rank
    srun or mpirun gave it, MASTER_ADDR = the allocation's first host, MASTER_PORT = the rendezvous port), so a
    plain env:// script runs unchanged."""
    script = REPO / "tests" / "integration" / "jobs" / "env_contract.py"
    res = slurm.cli("train", "--nodes", "3", "--mode", "mpi", "--script", str(script), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found = re.findall(r"^\[(node-\d)\] \[rank(\d)\] CONTRACT rank=(\d) world=(\d) local=(\d) local_world=(\d) "
                       r"group=(\d) master=(\S+) sum=(\d) ", res.stdout, re.M)
    assert sorted(rank for _, rank, *_ in found) == ["0", "1", "2"], res.stdout[-3000:]
    for node, shown, rank, world, local, local_world, group, master, total in found:
        assert shown == rank == group and node == f"node-{rank}", found
        assert (world, local, local_world, master, total) == ("3", "0", "1", f"{slurm.name}-node-0:29500", "3")
    assert_nothing_left(slurm)


def test_killed_rank_and_ctrl_c_cancel_the_job(slurm):
    from multinode.providers.local.faults import node_pids

    proc, lines, reader = _start(slurm, "cpu")
    _wait_for(lines, r"^\[node-0\] \[rank\d\]: epoch 1/", proc, 300)
    job = re.search(r"submitted batch job (\d+)", "".join(lines))[1]
    workers = [pid for pid in node_pids(slurm.state, "node-1")
               if b"training/train.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
               and b"torch.distributed.run" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert workers, "no worker on node-1"
    os.kill(workers[0], signal.SIGKILL)
    err = _finish(proc, lines, reader)
    assert proc.returncode == 1, err
    assert "job failed first on node-1" in err and f"batch job {job}" in err, err
    assert_nothing_left(slurm)

    proc, lines, reader = _start(slurm, "mpi")
    _wait_for(lines, r"epoch 1/", proc, 300)
    job = re.search(r"submitted batch job (\d+)", "".join(lines))[1]
    proc.send_signal(signal.SIGINT)
    err = _finish(proc, lines, reader)
    assert proc.returncode == 130, err
    assert f"batch job {job} cancelled with scancel" in err, err
    assert_nothing_left(slurm)


def test_an_existing_cluster_reached_through_its_login_node(slurm, tmp_path):
    """PROVIDER=hosts describes the embedded cluster as users describe theirs: the login node (node-0),
    their key, a known_hosts holding its key, a work directory on the shared filesystem. The code is
    synced once, to the login node; the scheduler picks the nodes."""
    inv = slurm.inventory()
    head = inv.head
    hpc = Cluster(new_cluster_name("h"), slurm.home)
    up = hpc.cli("up", "--provider", "hosts", f"--option=login={head.ssh_user}@{head.private_ip}",
                 f"--option=ssh_key={inv.ssh_key}", f"--option=known_hosts={inv.known_hosts}",
                 f"--option=workdir={tmp_path / 'shared'}", f"--option=subnet={inv.subnet}",
                 f"--option=python={inv.python}", "--option=partition=batch", timeout=60)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        res = hpc.cli("train", "--nodes", "3", "--mode", "cpu", "--args", DIGITS, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert re.search(r"submitted batch job \d+", res.stdout)
        result = result_of(res.stdout)
        assert result["world_size"] == 3 and result["test_accuracy"] >= 0.95
        assert re.search(r"^\[node-0\] \[rank0\]", res.stdout, re.M), res.stdout[-2000:]
        assert sorted(p.name for p in (tmp_path / "shared" / "runs").iterdir()) == [
            p.name for p in hpc.runs()]  # one run directory on the shared filesystem, one locally
    finally:
        down = hpc.cli("down", timeout=60)
    assert down.returncode == 0 and not hpc.state.inventory_path.exists(), down.stdout + down.stderr
    assert_nothing_left(slurm)


def _rank_on(slurm, node: str) -> int:
    """The pid of one training rank (not torchrun's agent) on ``node``."""
    from multinode.providers.local.faults import node_pids

    for pid in node_pids(slurm.state, node):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"training/train.py" in cmdline and b"torch.distributed.run" not in cmdline and \
                any(e.startswith(b"RANK=") for e in environ):
            return pid
    raise AssertionError(f"no rank on {node}")


def test_a_project_with_setup_and_env_trains_through_the_scheduler(slurm, tmp_path):
    """The same run as over SSH: WORKDIR synced to every node, SETUP in each node's own environment, ENV's values
    sourced on the nodes and never shown, NPROC=auto; the batch job's ranks use all of it."""
    from test_project_local import ENV, FIXTURE, PACKAGE, SECRET, SETUP, assert_secret_nowhere, digest

    project = tmp_path / "proj"
    shutil.copytree(FIXTURE, project, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d",
                              str(project / "wheels")], capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stderr
    res = slurm.cli("train", "--nodes", "3", "--nproc", "auto", "--workdir", str(project), "--setup", SETUP,
                    "--env", ENV, "--script", "-m pkg.train", timeout=600, PROJECT_TOKEN=SECRET)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert re.search(r"submitted batch job \d+", res.stdout)
    assert len(re.findall(r"^\[node-\d\] SETUP: pip install", res.stdout, re.M)) == 3, res.stdout[-4000:]
    hosts = re.findall(r"PROJECT rank=\d world=3 host=(\S+) sum=6 expected=6", res.stdout)
    assert sorted(hosts) == [f"{slurm.name}-node-{i}" for i in range(3)], res.stdout[-4000:]
    for i in range(3):  # every node's ranks streamed with both prefixes
        assert re.search(rf"^\[node-{i}\] \[rank\d\]: PROJECT rank=", res.stdout, re.M), (i, res.stdout[-2000:])
    # termcolor from each node's own SETUP environment, one rank per node.
    envs = sorted(re.findall(r"DEP rank=\d termcolor=3\.3\.0 at=\S*/nodes/(node-\d)/env/", res.stdout))
    assert envs == ["node-0", "node-1", "node-2"], res.stdout[-4000:]
    checks = re.findall(r"ENVCHECK rank=\d token=([0-9a-f]{16}|unset) mode=([0-9a-f]{16}|unset)", res.stdout)
    assert checks == [(digest(SECRET), digest("fast"))] * 3, checks
    assert_secret_nowhere(slurm, res.stdout, res.stderr)
    assert SECRET not in (slurm.runs()[-1] / "job.sbatch").read_text()
    assert_nothing_left(slurm)


def test_a_stopped_rank_is_named_by_the_stall_watchdog(slurm):
    """A SIGSTOPped rank stops every rank's step heartbeat; the watchdog ends the batch job (scancel), the stacks
    taken before name the stopped rank, and nothing is left on any node."""
    proc = subprocess.Popen([sys.executable, "-m", "multinode", "train", "--nodes", "3", "--stall-timeout", "8",
                             "--pg-timeout", "60", "--args", "--workload digits 200 50"], cwd=REPO, env=slurm.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        _wait_for(lines, r"\[rank\d\]: .*epoch 2/200 ", proc, 300)
        os.kill(_rank_on(slurm, "node-1"), signal.SIGSTOP)
        assert proc.wait(timeout=150) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    stdout, stderr = "".join(lines), proc.stderr.read()
    assert re.search(r"no rank made progress \(step heartbeat\) for \d+ s \(STALL_TIMEOUT=8\)", stdout), stdout[-3000:]
    assert "job failed first on node-1 (rank" in stderr, stderr
    assert re.search(r"root cause: node-1 rank \d+ \(pid \d+\) is stopped \(state T", stderr), stderr
    assert_nothing_left(slurm)


def test_a_node_with_other_software_is_refused_before_submission(slurm, tmp_path):
    """node-2's sessions see another torch first on their path: the skew check refuses the job at pre-flight,
    before anything is submitted."""
    runs_before = slurm.runs()
    with another_torch(slurm, "node-2", tmp_path):
        res = slurm.cli("train", "--nodes", "3", "--args", DIGITS, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "node-2 runs other software than node-0 (torch 2.12.0+cpu vs 2.13.0+cpu)" in res.stderr, res.stderr
    assert "submitted batch job" not in res.stdout and slurm.runs() == runs_before
    assert squeue(slurm) == []
