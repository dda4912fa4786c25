"""Config validation and CLI error paths: one line, exit 2, nothing touched."""

from __future__ import annotations

import pytest

from multinode import cli
from multinode.core.config import ClusterSpec, LaunchSpec
from multinode.core.errors import UserError


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="tpu"), "unknown MODE 'tpu'; valid modes: cpu, gpu, mpi, mpi-gpu"),
        (dict(nodes=0), "NODES=0 must be at least 1"),
        (dict(nproc=0), "NPROC=0 must be at least 1"),
        (dict(rdzv_port=80), "RDZV_PORT=80 must be in 1024..65535"),
        (dict(elastic="3:2", nodes=2), "ELASTIC='3:2' must look like MIN:MAX"),
        (dict(elastic="1:3", nodes=2), "MAX must equal NODES=2"),
        (dict(mode="mpi", max_restarts=1), "MAX_RESTARTS is for torchrun modes"),
    ],
)
def test_launch_spec_errors(kwargs, message):
    with pytest.raises(UserError) as err:
        LaunchSpec(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="Bad_Name"), "cluster name 'Bad_Name' is invalid"),
        (dict(cluster_type="p5"), "unknown CLUSTER_TYPE 'p5'; valid cluster types: cpu, g4dn, g4ad"),
        (dict(mtu=100), "MTU=100 is outside 576..65535"),
        (dict(nodes=0), "NODES=0 must be at least 1"),
    ],
)
def test_cluster_spec_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        ClusterSpec(**kwargs)


def test_cli_unknown_mode_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert cli.main(["train", "--mode", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "multinode: unknown MODE 'tpu'; valid modes: cpu, gpu, mpi, mpi-gpu"
    assert list(tmp_path.iterdir()) == []


def test_cli_train_before_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert cli.main(["--cluster", "nope", "train"]) == 2
    assert capsys.readouterr().err.strip() == "multinode: cluster 'nope' is not up; run 'make up' first"
    assert list(tmp_path.iterdir()) == []


def test_cli_unknown_provider(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert cli.main(["up", "--provider", "gcp"]) == 2
    assert "unknown PROVIDER 'gcp'; valid providers: local, aws" in capsys.readouterr().err


def test_cli_env_defaults_and_args_split(monkeypatch):
    monkeypatch.setenv("MULTINODE_NODES", "3")
    monkeypatch.setenv("MULTINODE_ARGS", "--workload hello 1 1")
    args = cli.build_parser().parse_args(["train", "--mode", "mpi"])
    spec = cli._launch_spec(args)
    assert (spec.mode, spec.nodes, spec.args) == ("mpi", 3, ("--workload", "hello", "1", "1"))


def test_cli_bad_quotes_in_args(capsys):
    assert cli.main(["train", "--args", "--x 'unclosed"]) == 2
    assert "cannot be split like a shell line" in capsys.readouterr().err
