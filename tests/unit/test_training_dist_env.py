"""Who started the trainer (pure: environment in, Launch out), the plan that follows, and the
entry point's refusal of bad input before any process group exists (in-process, no sockets)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from training import train
from training.config import ConfigError, load
from training.dist_env import Launch, detect
from training.mpi_plane import gpu_aware

REPO = Path(__file__).resolve().parents[2]


def test_torchrun_and_the_bare_env_contract():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    assert detect(env) == Launch("env", 1, 4, 1, "10.0.0.1", 29400)  # e.g. multinode's static launch
    assert detect({**env, "TORCHELASTIC_RUN_ID": "r1"}) == Launch("torchrun", 1, 4, 1, "10.0.0.1", 29400)


def test_open_mpi_and_mpich():
    mpi = detect({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (mpi.launcher, mpi.rank, mpi.world_size, mpi.local_rank) == ("mpirun", 1, 2, 0)
    mpich = detect({"PMI_SIZE": "3", "PMI_RANK": "2", "MPI_LOCALRANKID": "1"})
    assert (mpich.launcher, mpich.rank, mpich.world_size, mpich.local_rank) == ("mpirun", 2, 3, 1)


def test_mpi_wins_over_the_env_contract_multinode_adds_under_mpirun():
    """MODE=mpi gives every rank the env:// variables too (for scripts that read them); our trainer stays on MPI."""
    env = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert detect(env) == Launch("mpirun", 3, 4, 1)
    assert detect({**env, "PMIX_RANK": "3"}).launcher == "mpirun"  # srun --mpi=pmix in the SLURM MPI step


def test_slurm():
    slurm = detect({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"})
    assert (slurm.launcher, slurm.rank, slurm.world_size, slurm.local_rank, slurm.master_addr) == \
        ("slurm", 3, 4, 1, "10.1.1.1")
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "10.2.2.2"}).master_addr == "10.2.2.2"


def test_torchrun_inside_a_slurm_allocation_is_torchrun():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h",
           "TORCHELASTIC_RUN_ID": "r1"}
    assert detect(env).launcher == "torchrun"


def test_single_process():
    assert detect({}).launcher == "single" and not detect({}).distributed


@pytest.mark.parametrize("argv, launch, fragment", [
    (["--backend", "mpi"], Launch("mpirun", 0, 2), "no MPI backend"),
    (["--backend", "nccl"], Launch("torchrun", 0, 2, 0, "h"), "backend=nccl needs a GPU"),
    (["--data-plane", "mpi"], Launch("torchrun", 0, 2, 0, "h"), "data_plane=mpi needs mpirun"),
    (["--strategy", "single"], Launch("torchrun", 0, 2, 0, "h"), "strategy=single"),
    (["--strategy", "ddp"], Launch("single"), "strategy=ddp but this is a single process"),
])
def test_plan_refuses_impossible_combinations(argv, launch, fragment):
    if "mpi" in argv and torch.distributed.is_mpi_available():
        pytest.skip("this torch has the MPI backend")  # never on the stock wheels CI uses
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        train.plan(load(argv), launch, torch.device("cpu"))


def test_plan_picks_the_data_plane():
    cfg = load([])
    cpu = torch.device("cpu")
    assert train.plan(cfg, Launch("mpirun", 0, 2), cpu) == ("gloo", "mpi")
    assert train.plan(cfg, Launch("torchrun", 0, 2, 0, "h"), cpu) == ("gloo", "ddp")
    assert train.plan(cfg, Launch("single"), cpu) == ("gloo", "ddp")


@pytest.mark.parametrize("argv, fragment", [
    (["--device", "gpu"], "--device gpu but this node has no usable GPU"),
    (["--workload", "mnist", "--data-dir", "/nonexistent"], "workload mnist"),
    (["--batch-size", "0"], "batch-size=0"),
    (["--config", "/nonexistent.yaml"], "no such file"),
    (["--spawn", "-1"], "spawn=-1"),
    (["--spawn", "2", "--strategy", "single"], "strategy=single but the launcher started 2"),
])
def test_main_refuses_bad_input_with_one_line_and_exit_2(argv, fragment, capsys, monkeypatch):
    if "gpu" in argv and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    assert train.main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith("train.py: error: ") and out.err.count("\n") == 1 and fragment in out.err, out.err
    assert "RESULT" not in out.out


def test_mnist_error_says_torchvision_plainly(capsys):
    try:
        import torchvision  # noqa: F401
    except Exception:
        assert train.main(["--workload", "mnist"]) == 2
        assert "torchvision" in capsys.readouterr().err
    else:
        pytest.skip("torchvision imports here; the missing-data case is covered above")


def test_gpu_awareness_probe_never_raises():
    assert gpu_aware(None, rocm=False) is False
    assert gpu_aware("/nonexistent/libmpi.so", rocm=False) is False


def test_training_never_imports_the_orchestrator():
    """training/ is copied alone to the nodes: the multinode package is not there."""
    for path in (REPO / "training").glob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+(multinode|scripts)\b", path.read_text(), re.M), path


def test_spawn_under_a_launcher_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert train.main(["--spawn", "2", "--workload", "hello"]) == 2
    assert "--spawn 2 but env already started 2 processes" in capsys.readouterr().err
