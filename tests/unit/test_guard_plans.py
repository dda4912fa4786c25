"""The notice guard on every node (issue 22): the file runs by path with its siblings loaded under a private package
name, the sync sends exactly those files to ``code/guard`` (its manifest read with the project's, in one command),
and the SLURM batch script with GRACE keeps its pipeline through a SIGTERM, asks for ``--signal=TERM@GRACE``, puts
a user's program behind the node's guard and reports a preempted task without tripping ``--kill-on-bad-exit``.
Plans and texts only: nothing is started."""

from __future__ import annotations

import io
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from multinode.backends.slurm.follow import NODE_EXITED, SlurmEnded
from multinode.backends.slurm.job import SlurmJobRun
from multinode.backends.slurm.script import plan_sbatch
from multinode.code.sync import GUARD_MARK, guard_tree, read_manifest, split_manifests
from multinode.core.config import LaunchSpec
from multinode.core.errors import NodeError
from multinode.core.events import Events
from multinode.core.outcome import Ending, Outcome
from multinode.plan.launchers import EntryPoint
from multinode.plan.launchers.base import GUARD_FILES, guard_script

REPO = Path(__file__).resolve().parents[2]
OURS = EntryPoint("training/train.py", ("--workload", "digits", "4", "2"))
USER = EntryPoint("train.py", ("--epochs", "2"), ours=False, subdir="project")


def test_the_guard_run_by_path_loads_its_siblings_under_a_private_name(monkeypatch):
    monkeypatch.delitem(sys.modules, "_multinode_guard", raising=False)
    module = runpy.run_path(str(REPO / "training" / "guard.py"), run_name="guard_by_path")
    assert module["imds"].__name__ == "_multinode_guard.imds"
    assert module["Watcher"].__module__ == "_multinode_guard.notice" and module["EXIT_PREEMPTED"] == 75
    for name in [n for n in sys.modules if n.startswith("_multinode_guard")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_synced_guard_is_the_guard_and_what_it_imports(inventory):
    tree = guard_tree()
    assert sorted(tree.manifest.files) == sorted(GUARD_FILES) == ["__init__.py", "channel.py", "guard.py", "imds.py", "notice.py"]
    imports = {line.split()[1] for name in GUARD_FILES for line in (tree.root / name).read_text().splitlines()
               if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
    assert not {name for name in imports if name.split(".")[0] in ("training", "multinode", "torch")}, imports
    assert guard_script(inventory, "node-2") == "/state/dev/nodes/node-2/code/guard/guard.py"


def test_one_command_reads_the_trees_manifest_and_the_guards(inventory):
    command = read_manifest(inventory, "node-1", "project")
    assert "/code/.project-manifest.json" in command and "/code/.guard-manifest.json" in command
    assert split_manifests(f'{{"a": 1}}\n\n{GUARD_MARK}\n{{"g": 2}}') == ('{"a": 1}\n', '{"g": 2}')
    assert split_manifests(f"\n{GUARD_MARK}\n") == ("", "")  # a node that never had either
    assert split_manifests('{"a": 1}') == ('{"a": 1}', "")


def sbatch(inventory, entry, **kwargs) -> str:
    return plan_sbatch(inventory, LaunchSpec(nodes=2, run_id="r1", **kwargs), entry,
                       "pmix" if kwargs.get("mode") == "mpi" else None).script


def task(script: str) -> list[str]:
    return script.split("<<'TASK'\n", 1)[1].split("\nTASK\n", 1)[0].splitlines()


@pytest.mark.parametrize("mode", ["cpu", "mpi"])
def test_slurm_without_grace_has_no_trap_no_signal_and_no_guard(inventory, mode):
    script = sbatch(inventory, USER, mode=mode)
    assert "trap" not in script and "--signal" not in script and "guard" not in script


def test_slurm_torchrun_with_grace(inventory):
    script = sbatch(inventory, USER, grace=29.5)
    assert "\n#SBATCH --signal=TERM@30\n" in script and "\nexport TORCH_ELASTIC_SHUTDOWN_TIMEOUT=30\n" in script
    lines = task(script)
    assert lines[0] == "trap '' TERM"  # the task's shell and the sed it starts outlive the SIGTERM
    for i in range(2):
        assert f"guard=/state/dev/nodes/node-{i}/code/guard/guard.py ;;" in lines[1 + 1 + i]
    launch = next(line for line in lines if "torch.distributed.run" in line)
    assert launch.startswith("{ trap : TERM; ") and launch.endswith('"$@"; } 2>&1 | sed -u "s/^/[$node] /"')
    assert ('--no-python env MULTINODE_GUARD=1 /repo/.venv/bin/python -I "$guard" --grace 29.5 -- '
            '/repo/.venv/bin/python -u train.py "$@"') in launch
    after = lines[lines.index(launch) + 1:]
    assert after[:3] == ["rc=${PIPESTATUS[0]}",
                         'if [ "$rc" != 0 ] && [ -e "$MULTINODE_PREEMPT_MARK" ]; then rc=75; fi',
                         'if [ "$rc" = 75 ]; then echo "[$node] multinode: $node exited with code 75 (preempted)"; '
                         'exit 0; fi']
    assert lines[lines.index(launch) - 2:lines.index(launch)] == ['export MULTINODE_PREEMPT_MARK="$rundir/preempted"',
                                                                  'rm -f "$MULTINODE_PREEMPT_MARK"']
    ours = next(line for line in task(sbatch(inventory, OURS, grace=30.0)) if "torch.distributed.run" in line)
    assert '-I "$guard" --grace 30 -- /repo/.venv/bin/python -u training/train.py' in ours  # every worker


def test_slurm_mpi_with_grace_catches_in_the_rank_and_ignores_in_both_seds(inventory):
    lines = task(sbatch(inventory, USER, mode="mpi", nproc=2, grace=30.0))
    assert lines[0] == "trap '' TERM"
    launch = next(line for line in lines if "train.py" in line)
    group, rank_sed, node_sed = launch.split(" 2>&1 | ")
    assert group.startswith("{ trap : TERM; RANK=") and group.endswith('-u train.py "$@"; }')
    assert 'env MULTINODE_GUARD=1 /repo/.venv/bin/python -I "$guard" --grace 30 -- ' in group
    assert rank_sed.startswith("sed -u") and node_sed.startswith("sed -u")  # outside the group: they ignore TERM
    assert not any("MULTINODE_PREEMPT_MARK" in line for line in lines)  # each task is a rank: its own 75
    ours = next(line for line in task(sbatch(inventory, OURS, mode="mpi", grace=30.0)) if "train.py" in line)
    assert "guard" not in ours  # our trainer takes notices itself


def slurm_outcome(state: str, *reported: int, ending: Ending = Ending()) -> Outcome:
    """The outcome the SLURM job's handle makes of a batch job that ended ``state`` with these tasks reporting."""
    runner = SimpleNamespace(inventory=make_inventory(2))
    job = SlurmJobRun(runner, None, "7", ["node-0", "node-1"], io.StringIO(), Path("/nonexistent"), Events())
    job.ended = SlurmEnded("7", state, 0 if state == "COMPLETED" else 1,
                           failed_nodes=[(f"node-{i}", code, None) for i, code in enumerate(reported)])
    return job.outcome(ending)


def test_a_job_whose_tasks_report_only_75_ended_preempted_whatever_its_state():
    line = "[node-1] multinode: node-1 exited with code 75 (preempted)"
    assert NODE_EXITED.match(line)[2] == "75"
    assert slurm_outcome("COMPLETED", 75).kind == "preempted" and slurm_outcome("CANCELLED", 75, 75).kind == "preempted"
    assert slurm_outcome("FAILED", 75, 1).kind == "failed" and slurm_outcome("COMPLETED").kind == "succeeded"
    stall = NodeError("node-0", "job", None, "no progress for 60 s; the job was stopped")
    assert slurm_outcome("CANCELLED", 75, ending=Ending("stalled", stall)).kind == "stalled"
