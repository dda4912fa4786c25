"""The notice guard reaches a node whose Python has never heard of our ``training`` package (issue 22).

On AWS (host runtime), in the images and on SLURM nodes, the interpreter that runs the ranks has torch but not our
package; a project may have a ``training`` package of its own. Here, on 2 real local nodes (sshd per node), the
cluster's interpreter is swapped for such a Python -- a virtual environment whose site-packages reaches the
project's torch and nothing of ours (``import training`` fails in it, so the former ``python -I -m training.guard``
could not start) -- and the project carries its own ``training`` package with a decoy ``guard.py``. With GRACE:

* a user script using the helper (tests/integration/jobs/user_preempt.py, its own copy of ``training.preempt``)
  gets a SIGTERM on node-1, every rank stops at one step, rank 0 saves, the run ends 75;
* a script that knows nothing of notices gets a spot notice on node-1's metadata endpoint through the guard alone
  (SIGTERM, it saves in its handler and dies by the signal), and the run ends 75 ("preempted").

Times are never asserted. After each run nothing of it is left on any node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.drills.common import RUN_BOUND, watched
from bench.drills.preempt import run_sigterm_drill
from localcluster import preempt_project

pytestmark = pytest.mark.integration

EXIT_PREEMPTED = 75
GRACE = "30"
DECOY = "raise SystemExit(\"the project's own training.guard ran instead of the orchestrator's\")\n"
# A user script that does nothing about notices but what any program may do: save in a SIGTERM handler, then die
# by the signal. It runs STEPS steps (0.05 s each) unless stopped; each rank only sleeps (no collectives). node-0 gets
# no notice and runs all of them (20 s); node-1's notice is armed at its step 20 and the guard polls every 5 s, so its
# save lands near step 120, well inside.
STEPS = 400
PLAIN = (Path(__file__).parent / "jobs" / "plain_sigterm.py").read_text()


def bare_python(root: Path) -> Path:
    """A Python with this environment's site-packages on its path (torch, numpy) but none of its ``.pth`` files:
    our editable install's finder is not run, so neither ``training`` nor ``multinode`` can be imported."""
    env = root / "bare"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "reach-torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def in_node(cluster, node: str, *argv: str) -> subprocess.CompletedProcess:
    from multinode.providers.local.meta import net_plan, node_index

    ns = net_plan(cluster.state).netns(node_index(node))
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def bare(cluster2, tmp_path_factory):
    """cluster2 whose nodes run the job with :func:`bare_python`."""
    python = bare_python(tmp_path_factory.mktemp("nodepython"))
    original = cluster2.inventory()
    replace(original, python=str(python)).save(cluster2.state.inventory_path)
    try:
        yield cluster2
    finally:
        original.save(cluster2.state.inventory_path)


def test_the_node_python_has_torch_but_not_our_package(bare):
    python = bare.inventory().python
    assert in_node(bare, "node-1", python, "-I", "-c", "import torch").returncode == 0
    for module in ("training", "multinode"):
        res = in_node(bare, "node-1", python, "-I", "-c", f"import {module}")
        assert res.returncode != 0 and f"No module named '{module}'" in res.stderr, res
    old = in_node(bare, "node-1", python, "-I", "-m", "training.guard", "--grace", "1", "--", "true")
    assert old.returncode != 0 and "No module named 'training'" in old.stderr, old  # the former plan's guard


def plan_of(cluster, run_id: str) -> dict:
    return json.loads((cluster.state.run_dir(run_id) / "plan.json").read_text())


def assert_guard_by_path(cluster, run_id: str) -> None:
    """Every node's argv runs the guard synced under its own code directory, by path, never ``-m training.guard``."""
    inv = cluster.inventory()
    for cmd in plan_of(cluster, run_id)["commands"]:
        guard = f"{inv.workdir_for(cmd['node'])}/code/guard/guard.py"
        assert guard in cmd["argv"] and "training.guard" not in cmd["argv"], cmd["argv"]
        assert Path(guard).is_file()


def test_a_user_script_with_its_own_training_package_checkpoints_and_ends_preempted(bare, tmp_path):
    project = preempt_project(tmp_path)
    (project / "training" / "guard.py").write_text(DECOY)
    out = tmp_path / "user-ckpt.pt"
    args = ["train", "--nodes", "2", "--run-id=gbare", "--script=user_preempt.py", f"--workdir={project}",
            f"--grace={GRACE}", f"--args=--steps 100000 --out {out}"]
    result = run_sigterm_drill(bare, "gbare", script=b"user_preempt.py", args=args)
    assert result.exit_code == EXIT_PREEMPTED, result
    assert len(result.stops) == 2 and len(set(result.stops.values())) == 1, result.stops
    assert torch.load(out)["step"] == next(iter(result.stops.values()))[2]
    assert_guard_by_path(bare, "gbare")
    assert not any(result.left_at_exit.values()), result


def test_a_script_that_knows_nothing_of_notices_gets_the_spot_notice_through_the_guard(bare, tmp_path):
    from multinode.providers.local.imds import ENDPOINT, arm_notice, start_endpoint, stop_endpoint

    project = tmp_path / "plain"
    (project / "training").mkdir(parents=True)
    (project / "training" / "__init__.py").write_text("")
    (project / "training" / "guard.py").write_text(DECOY)
    (project / "plain.py").write_text(PLAIN)
    out = tmp_path / "ckpt"
    args = ["train", "--nodes", "2", "--run-id=gplain", "--script=plain.py", f"--workdir={project}",
            f"--grace={GRACE}", f"--env=AWS_EC2_METADATA_SERVICE_ENDPOINT={ENDPOINT}", f"--args={out} {STEPS}"]
    start_endpoint(bare.state, "node-1")
    try:
        proc = bare.popen(*args)
        with watched(proc) as (lines, err):
            lines.wait_for(r"\[rank1\]: step 20 ", timeout=RUN_BOUND)
            arm_notice(bare.state, "node-1", 0.0)
            code = proc.wait(timeout=RUN_BOUND)
    finally:
        stop_endpoint(bare.state, "node-1")
    text = "".join(lines.lines) + "".join(err.lines)
    assert code == EXIT_PREEMPTED, text[-4000:]
    assert "training.guard: spot interruption notice (terminate" in text, text[-4000:]
    assert 20 <= int(Path(f"{out}.rank1").read_text()) < STEPS  # node-1's rank saved mid-run, on the guard's SIGTERM
    assert not Path(f"{out}.rank0").exists()  # node-0 got no notice and ran to the end
    summary = json.loads((bare.state.run_dir("gplain") / "summary.json").read_text())
    assert summary["exit_codes"] == {"node-0": 0, "node-1": EXIT_PREEMPTED}, summary["exit_codes"]
    assert "run gplain PREEMPTED" in text, text[-4000:]
    assert_guard_by_path(bare, "gplain")
    assert not any(bare.job_processes().values())
