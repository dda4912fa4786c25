"""MODE=mpi on real local nodes (real mpirun, real sshd per node): every rank gets torch's env:// contract, so
an env:// script and a Hugging Face ``Trainer`` script run unchanged; a rank's traceback reads in the log as
Python printed it (mpirun's mid-line tags re-assembled); ENV may not set what the launcher sets."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
# transformers + accelerate and what they need beyond the cluster's environment (torch 2.13.0+cpu, numpy,
# PyYAML, regex, tqdm, packaging, filelock...): the set `pip install --dry-run --report` resolved against this
# repo's .venv on 2026-11-24, every version on PyPI then (`pip index versions transformers`: 5.23.0 latest,
# `accelerate`: 1.15.0 latest). transformers 5.23.0 requires Python >= 3.11 and no torch pin of its own;
# accelerate 1.15.0 requires torch >= 2.0.0 (their wheels' METADATA).
HF_PINS = (
    "transformers==5.23.0", "accelerate==1.15.0", "huggingface_hub==2.4.0", "hf-xet==1.8.0", "httpx2==2.16.2",
    "httpcore2==2.16.2", "tokenizers==0.23.3", "anyio==4.16.0", "h11==0.16.0", "safetensors==0.8.0",
    "truststore==0.10.5", "psutil==7.2.2", "typer==0.29.2", "annotated-doc==0.0.7", "shellingham==1.5.4",
)
WHEEL_CACHE = Path("/var/tmp/multinode-tests/wheels")


def hf_wheels() -> Path:
    """The pinned wheels, downloaded once per machine into a folder named by the pins' hash (the nodes have
    no network: they install from these, offline)."""
    folder = WHEEL_CACHE / ("hf-" + hashlib.sha256("\n".join(HF_PINS).encode()).hexdigest()[:16])
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(partial), *HF_PINS],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (partial / ".complete").write_text("\n".join(HF_PINS) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def run_id(stdout: str) -> str:
    return re.search(r"run (\S+): MODE=", stdout)[1]


def test_an_env_script_runs_under_mpi_on_3_nodes(shared_cluster3):
    """A torchrun-style script (env://, gloo) under MODE=mpi, 2 ranks per node: each rank's RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE agree with Open MPI's; MASTER_ADDR/PORT are the head's cluster address and
    the run's rendezvous port."""
    res = shared_cluster3.cli("train", "--mode", "mpi", "--nodes", "3", "--nproc", "2", "--script",
                              str(JOBS / "env_contract.py"), timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    head = shared_cluster3.inventory().head.private_ip
    found = re.findall(r"^\[(node-\d)\] \[rank(\d)\]: CONTRACT rank=(\d) world=(\d) local=(\d) local_world=(\d) "
                       r"group=(\d) master=(\S+) sum=(\d) ompi_rank=(\d) omp=(\S+) unbuffered=(\S+) gloo_if=(\S+)$", res.stdout, re.M)
    assert len(found) == 6, res.stdout[-4000:]
    for node, shown, rank, world, local, local_world, group, master, total, ompi, omp, unbuffered, gloo in found:
        assert shown == rank == ompi and int(rank) // 2 == int(group) == int(node[-1]), found
        assert (world, local, local_world, master, total) == ("6", str(int(rank) % 2), "2", f"{head}:29500", "6")
        # in the environment each rank starts with, not only after MPI_Init
        assert (omp, unbuffered) == ("1", "1") and gloo != "unset", found
    assert not any(shared_cluster3.job_processes().values())


def test_env_may_not_set_what_mpirun_sets(shared_cluster3):
    before = shared_cluster3.runs()
    res = shared_cluster3.cli("train", "--mode", "mpi", "--nodes", "2", "--env", "MASTER_ADDR=10.9.9.9",
                              "--script", str(JOBS / "env_contract.py"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ENV names MASTER_ADDR, which the launcher sets on every rank" in lines[0], lines
    assert shared_cluster3.runs() == before


def test_a_ranks_traceback_in_the_log_is_the_one_python_printed(shared_cluster3, tmp_path):
    """Rank 1 raises under MODE=mpi: its lines in the head's log (and on the console), prefixes stripped, are
    its traceback as Python formatted it, line by line -- not Open MPI's chunks with tags mid-line."""
    tmp_path.chmod(0o777)
    res = shared_cluster3.cli("train", "--mode", "mpi", "--nodes", "3", "--script", str(JOBS / "raises.py"),
                              f"--args=--rank 1 --out {tmp_path}")  # hang guard: Cluster.cli's RUN_BOUND
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr
    expected = (tmp_path / "traceback-rank1.txt").read_text().splitlines()
    assert expected[0] == "Traceback (most recent call last):" and "^" in "".join(expected), expected
    assert expected[-1] == "KeyError: 'missing-warmup-rank1'"
    log = shared_cluster3.state.run_dir(run_id(res.stdout)) / "node-0.log"
    logged = [line.removeprefix("[rank1]: ") for line in log.read_text().splitlines() if line.startswith("[rank1]: ")]
    shown = [line.removeprefix("[node-1] [rank1]: ") for line in res.stdout.splitlines()
             if line.startswith("[node-1] [rank1]: ")]
    # Its stdout line and its stderr traceback are two pipes through mpirun: their relative order is a race (the
    # stdout line once landed between two traceback lines); each stream's own lines stay whole and in order.
    said = [line for line in logged if line.startswith("RAISES rank=1")]
    assert len(said) == 1 and [line for line in logged if line not in said] == expected, "\n".join(logged)
    assert shown == logged
    assert not re.search(r"\[\d+,\d+\]<std", log.read_text() + res.stdout)  # no Open MPI tag left anywhere
    assert re.search(r"job failed first on node-\d \(rank 1\)", res.stderr), res.stderr  # mpirun runs on node-0
    assert not any(shared_cluster3.job_processes().values())


def test_a_hugging_face_trainer_script_runs_under_mpi_on_2_nodes(shared_cluster3, tmp_path):
    """transformers' Trainer (accelerate's PartialState underneath) needs MASTER_ADDR/MASTER_PORT and the
    env:// ranks: under MODE=mpi it trains data-parallel over gloo, with transformers and accelerate installed
    on each node by SETUP from wheels (offline), and the two replicas end with identical weights."""
    project = tmp_path / "hf"
    shutil.copytree(JOBS / "hf_trainer", project)
    shutil.copytree(hf_wheels(), project / "wheels", ignore=shutil.ignore_patterns(".complete"))
    (project / "requirements.txt").write_text("--no-index\n--find-links wheels\n" + "\n".join(HF_PINS) + "\n")
    res = shared_cluster3.cli("train", "--mode", "mpi", "--nodes", "2", "--workdir", str(project),
                              "--script", "train.py",
                              "--setup", "pip install -q -r requirements.txt", "--args=--steps 12 --out hf-out", timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    found = re.findall(r"^\[(node-\d)\] \[rank(\d)\]: HF rank=(\d) world=(\d) distributed=(\w+) steps=(\d+) "
                       r"loss=([\d.]+) weights=(\S+)$", res.stdout, re.M)
    assert sorted((node, shown, rank) for node, shown, rank, *_ in found) == \
        [("node-0", "0", "0"), ("node-1", "1", "1")], res.stdout[-4000:]
    assert {(world, dist, steps) for *_, world, dist, steps, _, _ in found} == {("2", "True", "12")}
    assert len({weights for *_, weights in found}) == 1  # DDP kept the replicas identical
    assert "MASTER_ADDR env was not set" not in res.stdout + res.stderr
    assert not any(shared_cluster3.job_processes().values())
