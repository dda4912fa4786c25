"""Launch plans are pure: assert on argv and env, start nothing."""

from __future__ import annotations

import pytest

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.plan.launchers import EntryPoint, get_launcher, launcher_for_mode
from multinode.plan.launchers.mpirun import RANK_ENV
from conftest import plan_job
from multinode.diagnose.rank import own_failure, pick_root_cause
from multinode.core.errors import NodeError
from multinode.plan.runtime import to_shell


ENTRY = EntryPoint("training/train.py", ("--workload", "digits", "4", "2"))


def test_torchrun_plan_runs_on_every_node_with_head_rendezvous(inventory):
    spec = LaunchSpec(mode="cpu", nodes=3, nproc=2, run_id="r1")
    plan = get_launcher("torchrun").plan(inventory, spec, ENTRY)
    assert [c.node for c in plan.commands] == ["node-0", "node-1", "node-2"]
    assert plan.world_size == 6
    for i, cmd in enumerate(plan.commands):
        argv = cmd.argv
        assert argv[:3] == ("/repo/.venv/bin/python", "-m", "torch.distributed.run")
        assert "--nnodes=3" in argv and "--nproc-per-node=2" in argv
        assert "--rdzv-endpoint=10.200.7.10:29500" in argv
        assert "--rdzv-id=r1" in argv
        assert f"--local-addr=10.200.7.{10 + i}" in argv
        conf = next(a for a in argv if a.startswith("--rdzv-conf="))
        assert f"is_host={int(i == 0)}" in conf and "join_timeout=60" in conf
        assert cmd.cwd == f"/state/dev/nodes/node-{i}/code"
        assert cmd.env["OMP_NUM_THREADS"] == "1"
        # gloo pinned to the interface carrying the cluster subnet, never a hard-coded name
        assert "10.200.7.0/24" in cmd.node_env["GLOO_SOCKET_IFNAME"]
        tail = argv[argv.index("training/train.py") + 1 :]
        assert tail[:2] == ("--snapshot-dir", f"/state/dev/nodes/node-{i}/runs/r1/snapshots")
        assert tail[-4:] == ("--workload", "digits", "4", "2")


def test_torchrun_elastic_and_restarts(make_inv):
    spec = LaunchSpec(mode="cpu", nodes=3, elastic="2:3", max_restarts=2, run_id="r2")
    plan = get_launcher("torchrun").plan(make_inv(3), spec, ENTRY)
    argv = plan.commands[0].argv
    assert "--nnodes=2:3" in argv and "--max-restarts=2" in argv
    assert plan.commands[0].env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_user_script_gets_its_args_untouched(inventory):
    spec = LaunchSpec(mode="cpu", nodes=2, run_id="r3")
    entry = EntryPoint("user/x.py", ("--lr", "0.1"), ours=False)
    argv = get_launcher("torchrun").plan(inventory, spec, entry).commands[0].argv
    assert argv[-3:] == ("user/x.py", "--lr", "0.1")


def test_mpirun_plan_is_one_command_on_the_head(inventory):
    spec = LaunchSpec(mode="mpi", nodes=3, nproc=1, run_id="r4")
    plan = launcher_for_mode("mpi").plan(inventory, spec, ENTRY)
    assert len(plan.commands) == 1 and plan.participants == ("node-0", "node-1", "node-2")
    cmd = plan.commands[0]
    argv = cmd.argv
    assert cmd.node == "node-0" and argv[0] == "mpirun"
    assert argv[argv.index("btl_tcp_if_include") + 1] == "10.200.7.0/24"
    assert argv[argv.index("oob_tcp_if_include") + 1] == "10.200.7.0/24"
    rsh = argv[argv.index("plm_rsh_args") + 1]
    assert "-i /state/dev/id_ed25519" in rsh and "StrictHostKeyChecking=yes" in rsh
    # one app context per node, each in its own node-local directory
    assert argv.count(":") == 2
    assert "10.200.7.11:1" in argv and "/state/dev/nodes/node-2/code" in argv
    assert ["-x", "MULTINODE_RUN_ID"] == list(argv[argv.index("MULTINODE_RUN_ID") - 1 : argv.index("MULTINODE_RUN_ID") + 1])
    # every rank starts with the run id in its environment (remote ranks get -x values only inside MPI_Init)
    assert argv.count("MULTINODE_RUN_ID=r4") == 3
    at = argv.index("MULTINODE_RUN_ID=r4")
    assert argv[at - 1:at + 12] == ("env", "MULTINODE_RUN_ID=r4", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1",
                                    "MASTER_ADDR=10.200.7.10", "MASTER_PORT=29500", "GROUP_RANK=0",
                                    "sh", "-c", RANK_ENV, "-", "10.200.7.0/24", "/repo/.venv/bin/python")
    # the env:// contract: literal per app context (the node's index), the rest from Open MPI's own variables
    assert [a for a in argv if a.startswith("GROUP_RANK=")] == ["GROUP_RANK=0", "GROUP_RANK=1", "GROUP_RANK=2"]
    assert argv.count("MASTER_ADDR=10.200.7.10") == 3 and argv.count("MASTER_PORT=29500") == 3
    # so do the orted daemons Open MPI starts over SSH on the other nodes (the gang-stop finds them by it)
    assert argv[argv.index("orte_launch_agent") + 1] == "env MULTINODE_RUN_ID=r4 orted"
    assert cmd.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    (hostfile, content), = cmd.files.items()
    assert hostfile == "/state/dev/nodes/node-0/runs/r4/hostfile"
    assert content.splitlines() == [f"10.200.7.{10 + i} slots=1" for i in range(3)]


def test_failed_rank_parsers():
    torchrun_log = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026", "  rank      : 1 (local_rank: 0)"]
    assert get_launcher("torchrun").failed_rank(torchrun_log) == 1
    mpi_log = ["The first process to do so was:", "", "  Process name: [[4242,1],2]", "  Exit code:    3"]
    assert get_launcher("mpirun").failed_rank(mpi_log) == 2
    signal_log = ["mpirun noticed that process rank 1 with PID 77 on node 10.200.7.11 exited on signal 9 (Killed)."]
    assert get_launcher("mpirun").failed_rank(signal_log) == 1
    assert get_launcher("mpirun").failed_rank(["all good"]) is None


def test_unknown_launcher_lists_valid_ones():
    with pytest.raises(UserError, match="valid launchers: torchrun, mpirun"):
        get_launcher("horovodrun")


def test_nodes_larger_than_cluster_is_a_user_error(inventory):
    with pytest.raises(UserError, match=r"NODES=5 but cluster 'dev' has 3 nodes; run 'make up NODES=5'"):
        plan_job(inventory, LaunchSpec(mode="cpu", nodes=5))


def test_gpu_mode_on_cpu_nodes_is_a_user_error(inventory):
    with pytest.raises(UserError, match="MODE=gpu needs GPU nodes"):
        plan_job(inventory, LaunchSpec(mode="gpu", nodes=2))


def test_missing_script_is_a_user_error(inventory, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        plan_job(inventory, LaunchSpec(mode="cpu", nodes=2, script=str(tmp_path / "nope.py")))


def test_docker_runtime_wraps_with_host_network_and_gpus(make_inv):
    inv = make_inv(2, runtime="docker", accelerator="nvidia", image="multinode/cuda:0.1")
    spec = LaunchSpec(mode="gpu", nodes=2, run_id="r5")
    plan, _ = plan_job(inv, spec)
    line = to_shell(plan.commands[1], inv, "r5")
    assert "docker run --rm --name mn-r5-node-1 --network=host" in line
    assert "--gpus all" in line and "multinode/cuda:0.1 /repo/.venv/bin/python -m torch.distributed.run" not in line
    assert "-e GLOO_SOCKET_IFNAME" in line and "-e NCCL_SOCKET_IFNAME" in line
    assert "--device gpu" in line
    amd = make_inv(2, runtime="docker", accelerator="amd", image="multinode/rocm:0.1")
    line = to_shell(plan_job(amd, spec)[0].commands[0], amd, "r5")
    assert "--device /dev/kfd --device /dev/dri --group-add video" in line


def test_root_cause_skips_peer_reactions():
    peer = NodeError("node-0", "torchrun", 1, "exit", tail=["RuntimeError: Connection reset by peer"])
    cause = NodeError("node-1", "torchrun", 1, "exit", tail=["exitcode  : -9 (pid: 12)"])
    assert pick_root_cause([peer, cause], peer) is cause
    assert pick_root_cause([peer], peer) is peer


def test_when_every_failure_is_a_reaction_the_node_of_a_killed_rank_is_named_not_a_timeout_or_the_runs_stop():
    """A rank killed by a signal (-9, 137, an abort's -6) is named even when its node's log reads like a reaction;
    a rank whose collective timed out (exit 1) or the run's SIGTERM (-15, 143) is no such evidence, and the look at
    the live ranks (root_cause, which reads own_failure) is left as it was: a hung rank is still theirs to name."""
    timed_out = NodeError("node-0", "torchrun", 1, "exit", tail=["RuntimeError: ... timed out", "  exitcode  : 1"])
    stopped = NodeError("node-2", "torchrun", 143, "exit", tail=["Signals.SIGTERM", "  exitcode  : -15 (pid: 7)"])
    killed = NodeError("node-1", "torchrun", 1, "exit", tail=["c10::DistNetworkError::DistNetworkError",
                                                              "failed (exitcode: -9) local_rank: 0 (pid: 9)"])
    assert pick_root_cause([timed_out, stopped], timed_out) is timed_out and own_failure([timed_out, stopped]) is None
    assert pick_root_cause([timed_out, stopped, killed], timed_out) is killed
    assert own_failure([timed_out, stopped, killed]) is None


def test_a_plan_word_is_literal_unless_it_holds_shell_text_evaluated_on_the_node():
    from multinode.plan.launchers.words import Sh, assignments, cat, shell_join

    assert cat("--log-dir=", "/runs/r 1", "/torchrun") == "--log-dir=/runs/r 1/torchrun"  # literal: plain str
    word = cat("--log-dir=", Sh("$rundir"), '/a "b" $HOME')
    assert isinstance(word, Sh) and word == '--log-dir=$rundir/a \\"b\\" \\$HOME'  # the literal part stays literal
    assert shell_join(["python", "a b", "$HOME", word, Sh("$@")]) == (
        "python 'a b' '$HOME' --log-dir=\"$rundir/a \\\"b\\\" \\$HOME\" \"$@\"")
    assert assignments({"RANK": Sh("$SLURM_PROCID"), "WORLD_SIZE": "4", "X": "a b"}) == (
        "RANK=\"$SLURM_PROCID\" WORLD_SIZE=4 X='a b'")
