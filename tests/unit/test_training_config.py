"""Trainer configuration: YAML + flags, validated once; every bad value is one ConfigError line."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import ConfigError, load

REPO = Path(__file__).resolve().parents[2]


def test_seed_command_line_still_works():
    cfg = load(["1000", "1000", "--batch-size", "64"])
    assert (cfg.training.total_epochs, cfg.training.save_every, cfg.training.batch_size) == (1000, 1000, 64)


def test_orchestrator_flags_are_accepted():
    cfg = load(["--snapshot-dir", "/r/snap", "--metrics-dir", "/r", "--timeout", "20", "--device", "cpu",
                "--workload", "digits", "10", "5"])
    assert cfg.distributed.timeout == 20 and cfg.training.snapshot_dir == "/r/snap" and cfg.training.device == "cpu"


def test_flags_override_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed: {backend: gloo, timeout: 10}\ntraining: {workload: regression, batch_size: 8}\n")
    cfg = load(["--config", str(path), "--batch-size", "16"])
    assert cfg.distributed.backend == "gloo" and cfg.distributed.timeout == 10
    assert cfg.training.workload == "regression" and cfg.training.batch_size == 16


def test_sample_config_loads():
    cfg = load(["--config", str(REPO / "training" / "config.yaml")])
    assert cfg.distributed.strategy == "auto" and cfg.training.workload == "digits"


def test_bare_amp_means_auto():
    assert load(["--amp"]).training.amp == "auto" and load([]).training.amp == "off"


@pytest.mark.parametrize("yaml_text, fragment", [
    ("training: {batch_sise: 8}\n", "unknown key 'batch_sise'"),
    ("distributed: {backend: ucc}\n", "backend='ucc'"),
    ("distributed: {strategy: fsdp}\n", "strategy='fsdp'"),
    ("distributed: {timeout: 0}\n", "timeout=0"),
    ("training: [1, 2]\n", "must be a mapping"),
    ("training: {workload: cifar}\n", "workload='cifar'"),
    ("training: {grad_accum: 0}\n", "grad-accum=0"),
    ("training: {batch_size: [1}\n", "not valid YAML"),
])
def test_bad_yaml_values_name_the_value(tmp_path, yaml_text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        load(["--config", str(path)])


@pytest.mark.parametrize("argv, fragment", [
    (["--batch-size", "0"], "batch-size=0 must be at least 1"),
    (["--batch-size", "x"], "invalid int value: 'x'"),
    (["--backend", "bogus"], "backend='bogus' is not one of"),
    (["--workload", "imagenet"], "workload='imagenet' is not one of"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--lr", "-1"], "lr=-1.0 must be positive"),
])
def test_bad_flags_are_one_line_errors(argv, fragment):
    with pytest.raises(ConfigError) as err:
        load(argv)
    assert fragment in str(err.value) and "\n" not in str(err.value)
