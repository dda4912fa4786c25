"""Trainer configuration and launcher detection: pure, no process group."""

from __future__ import annotations

import pytest

from training.config import ConfigError, load
from training.dist_env import detect


def test_seed_command_line_still_works():
    cfg = load(["1000", "1000", "--batch-size", "64"])
    assert (cfg.training.total_epochs, cfg.training.save_every, cfg.training.batch_size) == (1000, 1000, 64)


def test_flags_override_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed: {backend: gloo, timeout: 10}\ntraining: {workload: regression, batch_size: 8}\n")
    cfg = load(["--config", str(path), "--batch-size", "16"])
    assert cfg.distributed.backend == "gloo" and cfg.distributed.timeout == 10
    assert cfg.training.workload == "regression" and cfg.training.batch_size == 16


@pytest.mark.parametrize("yaml_text, fragment", [
    ("training: {batch_sise: 8}\n", "unknown key 'batch_sise'"),
    ("distributed: {backend: ucc}\n", "backend='ucc'"),
    ("distributed: {timeout: 0}\n", "timeout=0"),
    ("training: [1, 2]\n", "must be a mapping"),
])
def test_bad_yaml_values_name_the_value(tmp_path, yaml_text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        load(["--config", str(path)])


def test_detect_every_launcher():
    assert detect({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1"}).launcher == "torchrun"
    mpi = detect({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (mpi.launcher, mpi.rank, mpi.world_size) == ("mpirun", 1, 2)
    assert detect({"PMI_SIZE": "2", "PMI_RANK": "0"}).launcher == "mpirun"  # MPICH
    slurm = detect({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1"})
    assert (slurm.launcher, slurm.rank, slurm.world_size, slurm.local_rank, slurm.master_addr) == \
        ("slurm", 3, 4, 1, "10.1.1.1")
    assert detect({}).launcher == "single" and not detect({}).distributed
