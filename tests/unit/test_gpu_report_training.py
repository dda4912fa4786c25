"""What the GPU check added to the trainer, on the CPU: ``--deterministic``, the ranks' weights digest of RESULT and
NCCL's error handling as dist_env sets it (in-process: no sockets, no subprocesses)."""

from __future__ import annotations

import json

import pytest
import torch

from training import dist_env, train
from training.config import load


def test_deterministic_is_off_by_default_and_a_flag_turns_it_on():
    assert load(["--workload", "digits"]).training.deterministic is False
    assert load(["--workload", "digits", "--deterministic"]).training.deterministic is True


def test_make_deterministic_sets_torch_and_cublas(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    try:
        train.make_deterministic()
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.benchmark is False
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]


def test_a_users_cublas_workspace_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        train.make_deterministic()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_weights_digest_sees_every_bit_and_every_dtype():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    first = train.weights_digest(model)
    assert first == train.weights_digest(model)  # the same state, the same digest
    with torch.no_grad():
        weight = model[0].weight.view(-1)
        weight[0] = torch.nextafter(weight[0], torch.tensor(1.0))  # one ulp
    assert train.weights_digest(model) != first
    half = train.weights_digest(model.to(torch.bfloat16))  # no numpy dtype: read as bytes
    assert len(half) == 64 and half != first


def test_run_workload_adds_the_ranks_agreement_only_where_there_are_ranks(capsys, tmp_path):
    code = train.main(["--workload", "regression", "--device", "cpu", "--metrics-dir", str(tmp_path), "1", "1"])
    assert code == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["amp"] == "off"
    assert "ranks_weights_equal" not in result  # one process: nothing to agree with


def test_nccl_environment_sets_both_and_keeps_a_users_values():
    env: dict[str, str] = {}
    assert dist_env.nccl_environment(env) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
                                              "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "1000"}
    mine = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15000"}
    assert dist_env.nccl_environment(dict(mine)) == mine


@pytest.mark.parametrize("flag", ["--device cuda", "--amp fp8"])
def test_bad_values_stay_one_line_errors(flag, capsys):
    assert train.main(["--workload", "digits", *flag.split(), "1", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error:")
