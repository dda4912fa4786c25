"""The static launcher (LAUNCHER=static): one starter per node, torchrun's env:// contract, no agents."""

from __future__ import annotations

import pytest

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.plan.launchers import EntryPoint, launcher_for
from multinode.plan.runtime import to_shell

ENTRY = EntryPoint("training/train.py", ("--workload", "digits", "4", "2"))


def test_static_plan_gives_every_node_the_env_contract(inventory):
    spec = LaunchSpec(mode="cpu", nodes=3, nproc=2, run_id="r1", launcher="static", rdzv_port=29600)
    launcher = launcher_for(spec)
    assert launcher.name == "static"
    plan = launcher.plan(inventory, spec, ENTRY)
    assert plan.launcher == "static" and plan.world_size == 6
    for i, cmd in enumerate(plan.commands):
        assert cmd.argv[:2] == ("sh", "-c")
        first_rank, nproc, status_dir = cmd.argv[4:7]
        assert (first_rank, nproc) == (str(2 * i), "2")
        assert status_dir == f"/state/dev/nodes/node-{i}/runs/r1/ranks"
        assert cmd.argv[7:9] == ("/repo/.venv/bin/python", "training/train.py")
        assert cmd.argv[-4:] == ("--workload", "digits", "4", "2")
        assert cmd.env["MASTER_ADDR"] == "10.200.7.10" and cmd.env["MASTER_PORT"] == "29600"
        assert cmd.env["WORLD_SIZE"] == "6" and cmd.env["LOCAL_WORLD_SIZE"] == "2" and cmd.env["GROUP_RANK"] == str(i)
        assert "RANK" not in cmd.env  # set per process by the starter
        assert "10.200.7.0/24" in cmd.node_env["GLOO_SOCKET_IFNAME"]
        assert "torch.distributed.run" not in cmd.argv
        assert "\n" not in to_shell(cmd, inventory, "r1")  # one shell line, as dry-run prints it


def test_static_failure_names_the_rank_like_torchrun(inventory):
    launcher = launcher_for(LaunchSpec(mode="cpu", launcher="static"))
    lines = ["[rank3]: boom", "Root Cause (first observed failure):", "  rank      : 3 (local_rank: 1)", "  exitcode  : 7"]
    assert launcher.failed_rank(lines) == 3
    assert launcher.failed_rank(["nothing here"]) is None


def test_mpi_modes_refuse_an_explicit_launcher():
    """MODE=mpi always starts ranks with mpirun: an explicit LAUNCHER is refused in one line, not ignored."""
    for launcher in ("static", "torchrun"):
        with pytest.raises(UserError) as err:
            LaunchSpec(mode="mpi", launcher=launcher)
        assert f"LAUNCHER={launcher} is for torchrun modes" in str(err.value) and "\n" not in str(err.value)
    assert launcher_for(LaunchSpec(mode="mpi", launcher="auto")).name == "mpirun"
    assert launcher_for(LaunchSpec(mode="cpu", launcher="torchrun")).name == "torchrun"


def test_auto_is_static_for_a_fixed_job_and_torchrun_when_agents_are_needed():
    assert launcher_for(LaunchSpec(mode="cpu")).name == "static"
    assert launcher_for(LaunchSpec(mode="gpu", nodes=2)).name == "static"
    assert launcher_for(LaunchSpec(mode="cpu", max_restarts=1)).name == "torchrun"
    assert launcher_for(LaunchSpec(mode="cpu", nodes=2, elastic="1:2")).name == "torchrun"
    assert launcher_for(LaunchSpec(mode="mpi")).name == "mpirun"


@pytest.mark.parametrize("kwargs, message", [
    ({"launcher": "agentless"}, "unknown LAUNCHER 'agentless'; valid launchers: auto, torchrun, static"),
    ({"launcher": "static", "max_restarts": 1}, "use LAUNCHER=torchrun with ELASTIC or MAX_RESTARTS"),
    ({"launcher": "static", "nodes": 2, "elastic": "1:2"}, "use LAUNCHER=torchrun with ELASTIC or MAX_RESTARTS"),
])
def test_static_launcher_refuses_what_it_cannot_do(kwargs, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        LaunchSpec(**kwargs)
