"""GRACE in the plans and the stops (docs/preemption.md): every rank's MULTINODE_GRACE, training/guard.py (the node's
synced copy, by path) in front of a user script (and of every torchrun worker), the launchers' own SIGTERM-to-SIGKILL waits set to GRACE, the static
starter that outlives a SIGTERM, the stop lines, and a stop signal to the orchestrator as a notice. Plans and
lines are asserted; nothing is started (the job's node sessions are stand-ins answering on threads)."""

from __future__ import annotations

import io
import signal
import threading

import pytest
from attempt_fakes import Sessions, loop

from multinode.backends.slurm.script import plan_sbatch
from multinode.core.config import LaunchSpec
from multinode.core.errors import EXIT_PREEMPTED
from multinode.plan.launchers import EntryPoint, launcher_for
from multinode.plan.launchers.static import STARTER, starter
from multinode.plan.launchers.torchrun import PREEMPTED_EXIT
from multinode.app import watch
from multinode.ssh.runner import STOP_GRACE, RemoteRunner, StopPolicy

OURS = EntryPoint("training/train.py", ("--workload", "digits", "4", "2"))
USER = EntryPoint("train.py", ("--epochs", "2"), ours=False, subdir="project")


def guard(node: int = 0, grace: str = "30") -> tuple[str, ...]:
    """The guard in front of a rank on ``node-<node>``: the copy synced under that node's code directory, by path."""
    return ("env", "MULTINODE_GUARD=1", "/repo/.venv/bin/python", "-I",
            f"/state/dev/nodes/node-{node}/code/guard/guard.py", "--grace", grace, "--")


def plan(inventory, entry, **kwargs):
    spec = LaunchSpec(nodes=3, run_id="r1", **kwargs)
    return launcher_for(spec).plan(inventory, spec, entry)


def test_without_grace_nothing_changes(inventory):
    for kwargs in (dict(launcher="static"), dict(launcher="torchrun"), dict(mode="mpi")):
        for cmd in plan(inventory, USER, **kwargs).commands:
            assert "MULTINODE_GRACE" not in cmd.env and not any(arg.endswith("/guard.py") for arg in cmd.argv)
            assert not any("MULTINODE_GRACE" in arg or "sigkill" in arg for arg in cmd.argv)
            assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in cmd.env
    assert plan(inventory, OURS, launcher="static").commands[0].argv[2] == STARTER
    assert plan(inventory, OURS, launcher="torchrun").commands[0].argv[1:3] == ("-m", "torch.distributed.run")


def test_static_every_rank_gets_the_grace_and_a_user_script_the_guard(inventory):
    for i, cmd in enumerate(plan(inventory, USER, launcher="static", grace=30.0).commands):
        assert cmd.env["MULTINODE_GRACE"] == "30"
        assert cmd.argv[2] == starter(True) != STARTER
        assert cmd.argv[7:17] == (*guard(i), "/repo/.venv/bin/python", "train.py")
    ours = plan(inventory, OURS, launcher="static", grace=7.5).commands[0]
    assert ours.env["MULTINODE_GRACE"] == "7.5"
    assert ours.argv[7:9] == ("/repo/.venv/bin/python", "training/train.py")  # our trainer takes notices itself


def test_the_static_starter_with_grace_outlives_sigterm_and_its_ranks_do_not_ignore_it():
    text = starter(True)
    assert text.startswith("trap '' TERM; ")  # the starter, and the seds it starts, ignore SIGTERM
    assert "{ trap : TERM; RANK=$rank LOCAL_RANK=$i \"$@\" 2>&1; c=$?;" in text  # caught: the rank gets the default
    assert text.count("trap") == 2 and text.replace("trap '' TERM; ", "").replace("trap : TERM; ", "") == STARTER


def test_torchrun_waits_the_grace_guards_every_worker_and_turns_the_guards_note_into_75(inventory):
    for i, cmd in enumerate(plan(inventory, OURS, launcher="torchrun", grace=29.5).commands):
        mark = f"/state/dev/nodes/node-{i}/runs/r1/preempted"
        assert cmd.argv[:4] == ("sh", "-c", PREEMPTED_EXIT, mark) and cmd.env["MULTINODE_PREEMPT_MARK"] == mark
        argv = list(cmd.argv)
        assert argv[4:7] == ["/repo/.venv/bin/python", "-m", "torch.distributed.run"]
        assert cmd.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "30"  # the agent's own wait, rounded up
        start = argv.index("--no-python")
        assert argv[start + 1:start + 13] == [*guard(i, "29.5"), "/repo/.venv/bin/python", "-u",
                                              "training/train.py", "--snapshot-dir"]
        assert cmd.env["MULTINODE_GRACE"] == "29.5"
    assert PREEMPTED_EXIT.startswith("trap : TERM; \"$@\"; c=$?;") and "c=75" in PREEMPTED_EXIT


def test_torchrun_runs_a_module_behind_the_guard(inventory):
    module = EntryPoint("pkg.train", ("--lr", "1"), ours=False, module=True, subdir="project")
    argv = list(plan(inventory, module, launcher="torchrun", grace=30.0).commands[0].argv)
    start = argv.index("--no-python")
    assert argv[start + 1:] == [*guard(), "/repo/.venv/bin/python", "-u", "-m", "pkg.train", "--lr", "1"]


def test_mpirun_sets_its_own_sigkill_wait_to_the_grace_and_every_rank_gets_it(inventory):
    argv = list(plan(inventory, USER, mode="mpi", grace=12.2).commands[0].argv)
    at = argv.index("odls_base_sigkill_timeout")
    assert argv[at - 1:at + 2] == ["--mca", "odls_base_sigkill_timeout", "13"]
    assert argv.count("MULTINODE_GRACE=12.2") == 3  # each node's app context
    guards = [i for i, arg in enumerate(argv) if arg.endswith("/code/guard/guard.py")]
    assert [argv[i] for i in guards] == [guard(n)[4] for n in range(3)]  # each node's own copy
    assert all(argv[i - 1:i + 4] == ["-I", argv[i], "--grace", "12.2", "--"] for i in guards)


def test_mpirun_keeps_its_1_s_sigkill_wait_for_our_trainer(inventory):
    """Our trainer's ranks exit 75 only after the whole coordinated checkpoint: no rank needs mpirun's grace,
    and Open MPI 4.1 would sleep it twice after they are gone."""
    argv = list(plan(inventory, OURS, mode="mpi", grace=12.2).commands[0].argv)
    assert "odls_base_sigkill_timeout" not in argv and argv.count("MULTINODE_GRACE=12.2") == 3


def test_slurm_script_exports_the_grace(inventory):
    spec = LaunchSpec(nodes=2, run_id="r1", grace=45.0)
    assert "\nexport MULTINODE_GRACE=45\n" in plan_sbatch(inventory, spec, OURS).script
    assert "MULTINODE_GRACE" not in plan_sbatch(inventory, LaunchSpec(nodes=2, run_id="r1"), OURS).script


def test_the_stop_waits_the_grace_and_removes_containers_after_it(inventory):
    runner = RemoteRunner(inventory, out=io.StringIO())
    plain = runner.stop_line("r1", "docker rm -f c")
    assert plain.startswith("docker rm -f c; sh -c ") and plain.endswith(f" stop r1 {int(STOP_GRACE * 100)}")
    assert runner.stop_line("r1") == plain.removeprefix("docker rm -f c; ")
    graceful = RemoteRunner(inventory, out=io.StringIO(), stop=StopPolicy(30.0)).stop_line("r1", "docker rm -f c")
    assert graceful.endswith(" stop r1 3200; docker rm -f c")  # GRACE + 2 s (in hundredths), then the containers
    assert StopPolicy(30.0).kill_after == 32.0 and StopPolicy(0.5).kill_after == STOP_GRACE


class SignalledAtOnce:
    """StopSignals as if the user had pressed Ctrl-C before the first event."""

    def __init__(self):
        self.signum = signal.SIGINT

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def run_job(tmp_path, monkeypatch, codes, grace):
    """The attempt loop over node sessions that end only when the job is stopped, each with ``codes[node]``."""
    monkeypatch.setattr(watch, "StopSignals", SignalledAtOnce)
    runner = Sessions(codes, release=threading.Event(), grace=grace, stopped_code=None)
    runner.stopped_code = "codes"
    runner.execute = lambda name, command, timeout=None, out=None, err=None: (runner.stopped.wait(10), codes[name],
                                                                             b"", b"")[1:]
    return runner, loop(tmp_path, runner)


def test_ctrl_c_with_grace_is_a_notice_and_a_run_whose_ranks_exit_75_ends_preempted(tmp_path, monkeypatch):
    runner, job = run_job(tmp_path, monkeypatch, {"node-0": EXIT_PREEMPTED, "node-1": EXIT_PREEMPTED}, 30.0)
    outcome = job.run()
    assert outcome.kind == "preempted" and outcome.stopped_by == "SIGINT" and outcome.exit_code == EXIT_PREEMPTED
    assert outcome.exit_codes == {"node-0": 75, "node-1": 75}
    assert runner.said == ["SIGINT: a notice to every rank (SIGTERM; GRACE=30 s to checkpoint, then SIGKILL)"]


@pytest.mark.parametrize("codes, grace", [({"node-0": 75, "node-1": 1}, 30.0), ({"node-0": 0, "node-1": 0}, 30.0),
                                          ({"node-0": 75, "node-1": 75}, None)])
def test_ctrl_c_is_an_interruption_unless_grace_and_every_node_ended_0_or_75(tmp_path, monkeypatch, codes, grace):
    runner, job = run_job(tmp_path, monkeypatch, codes, grace)
    outcome = job.run()
    assert outcome.kind == "interrupted" and outcome.exit_code == 128 + signal.SIGINT and runner.stopped.is_set()
    assert outcome.failure.message == "interrupted; run r1 was stopped on every node"
