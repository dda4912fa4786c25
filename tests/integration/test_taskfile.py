"""The task file (multinode.yaml, issue 21 item 7) end to end: a run from a task file is the run the same
settings give as make variables (the same dry-run plan, through the real Makefile), the Makefile's own
defaults never hide a task file's value, a bad key is one line with nothing done, the dry run says where each
value came from, and a real 2-node job runs from a task file on a local cluster."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from localcluster import Cluster, bring_up, clean_env, tear_down
from test_golden_dry_run import CPU3, _project  # helpers, not tests

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TASK = """\
nodes: 2
mode: cpu
nproc: 2
script: train.py
args: [--epochs, "2"]
setup: pip install -r requirements.txt
env: [GOLDEN_TOKEN, MODE_NAME=fast]
launcher: static
stall_timeout: 120
"""
SAME_AS_VARIABLES = dict(NODES="2", MODE="cpu", NPROC="2", SCRIPT="train.py", ARGS="--epochs 2",
                         SETUP="pip install -r requirements.txt", ENV="GOLDEN_TOKEN MODE_NAME=fast", LAUNCHER="static",
                         STALL_TIMEOUT="120")
SETTINGS = re.compile(r"^settings \(flag > make variable > task file .*", re.S | re.M)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state directory holding the fake 3-node cluster 'dev' (nothing connects anywhere in a dry run)."""
    home = tmp_path / "home"
    (home / "dev").mkdir(parents=True)
    for name in ("id_ed25519", "known_hosts"):
        (home / "dev" / name).write_text("")
    replace(CPU3, ssh_key=str(home / "dev" / "id_ed25519"),
            known_hosts=str(home / "dev" / "known_hosts")).save(home / "dev" / "inventory.json")
    return home


def make_train(home: Path, *variables: str, **env: str) -> subprocess.CompletedProcess:
    """``make train DRY_RUN=1 <variables>`` as a user types it (the Makefile's exports included)."""
    environ = {k: v for k, v in clean_env(home, "dev").items() if k != "MULTINODE_CLUSTER"}
    environ.update(GOLDEN_TOKEN="s3cret-golden-value", MULTINODE_RUN_ID="golden", **env)
    return subprocess.run(["make", "--no-print-directory", "-s", "train", "DRY_RUN=1", *variables],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=120)


def settings(stdout: str) -> dict[str, tuple[str, str]]:
    """The dry run's settings block: key -> (value as shown, where it came from)."""
    return {key: (value, origin) for key, value, origin in re.findall(r"^  (\w+) +(.*?) +\[(.+)\]$", stdout, re.M)}


def plan_of(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stdout + res.stderr
    assert "s3cret-golden-value" not in res.stdout + res.stderr
    return SETTINGS.sub("", res.stdout)


def test_a_task_file_run_is_the_run_its_settings_give_as_make_variables(home: Path, tmp_path: Path):
    project = _project(tmp_path)
    from_variables = make_train(home, f"WORKDIR={project}", *(f"{k}={v}" for k, v in SAME_AS_VARIABLES.items()))
    assert "processes per node: node-0=2, node-1=2" in from_variables.stdout
    # TASK=<file> outside the project: its paths are relative to its own directory.
    (tmp_path / "multinode.yaml").write_text(TASK.replace("script: train.py", "workdir: project\nscript: project/train.py"))
    from_task = make_train(home, f"TASK={tmp_path / 'multinode.yaml'}")
    assert plan_of(from_task) == plan_of(from_variables)
    assert settings(from_task.stdout) and not settings(from_variables.stdout)  # shown with a task file only
    # WORKDIR's multinode.yaml: the same plan, but the task file is one more file of the project to sync.
    (project / "multinode.yaml").write_text(TASK)
    in_workdir = plan_of(make_train(home, f"WORKDIR={project}"))
    expected = plan_of(from_variables).replace("4 files, 62 bytes", f"5 files, {62 + len(TASK)} bytes")
    assert in_workdir == expected


def test_the_dry_run_says_where_each_value_came_from(home: Path, tmp_path: Path):
    project = _project(tmp_path)
    (project / "multinode.yaml").write_text("nodes: 3\nscript: train.py\nstall_timeout: 60\nenv: {GOLDEN_TOKEN: }\n")
    res = make_train(home, f"TASK={project}", "STALL_TIMEOUT=30")
    assert res.returncode == 0, res.stderr
    assert "run golden: static, world size 3" in res.stdout  # the Makefile's NODES ?= 2 did not hide nodes: 3
    found = settings(res.stdout)
    assert found["nodes"] == ("3", "task file") and found["script"] == (str(project / "train.py"), "task file")
    assert found["workdir"] == (str(project), "task file (its directory, as it names a script)")
    assert found["stall_timeout"] == ("30", "make variable STALL_TIMEOUT (MULTINODE_STALL_TIMEOUT)")
    assert found["env"] == ("GOLDEN_TOKEN=***", "task file")
    assert found["mode"] == ("cpu", "default") and found["args"] == ("-", "default")
    assert "world size 2" in make_train(home, f"TASK={project}", "NODES=2").stdout  # a variable wins


def test_without_a_task_file_make_train_keeps_its_defaults(home: Path):
    res = make_train(home)
    assert plan_of(res).startswith("run golden: static, world size 2, nodes node-0, node-1\n")
    assert "settings (" not in res.stdout


@pytest.mark.parametrize("text, message", [
    ("nodes: 2\nstall-timeout: 5\n", "unknown key 'stall-timeout'; did you mean 'stall_timeout'?"),
    ("num_nodes: 2\n", "unknown key 'num_nodes'; did you mean 'nodes'?"),
    ("nodes: two\n", "nodes: expected a whole number, got 'two'"),
    ("mode: tpu\n", "mode: unknown MODE 'tpu'; valid modes: cpu, gpu, mpi, mpi-gpu"),
    ("nodes: [2\n", "is not valid YAML at line 2"),
    ("cluster: dev\n", "cluster is not a task key: the cluster is chosen per command"),
])
def test_a_bad_task_file_is_one_line_and_nothing_happens(home: Path, tmp_path: Path, text: str, message: str):
    (tmp_path / "multinode.yaml").write_text(text)
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    res = make_train(home, f"TASK={tmp_path}")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 2 and "Traceback" not in res.stderr  # the line, and make's "Error 2"
    line = res.stderr.splitlines()[0]
    assert line.startswith(f"multinode: {tmp_path / 'multinode.yaml'}") and message in line, line
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


def test_make_passes_switches_as_words_and_a_bad_one_is_refused(home: Path):
    """DRY_RUN/QUEUE reach the CLI as MULTINODE_<NAME> (scripts/settings.mk), typed there: yes is on; a word that is not
    a switch's is one line, exit 2, nothing done (make used to turn any word, 0 included, into --queue)."""
    assert plan_of(make_train(home)) == plan_of(make_train(home, "DRY_RUN=yes", "QUEUE=true"))
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    res = make_train(home, "QUEUE=please")
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.splitlines()[0] == "multinode: QUEUE='please' must be 1 or 0 (also yes/no, true/false)"
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


ALLREDUCE = """\
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print(f"TASKRUN rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} args={sys.argv[1:]} "
      f"greeting={os.environ.get('GREETING')}", flush=True)
dist.destroy_process_group()
"""


def test_a_real_two_node_job_runs_from_a_task_file(cluster2: Cluster, tmp_path: Path):
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "allreduce.py").write_text(ALLREDUCE)
    (project / "multinode.yaml").write_text("nodes: 2\nnproc: 2\nscript: src/allreduce.py\nargs: --tag one\n"
                                            "env: [GREETING=hello]\nstall_timeout: 120\n")
    res = cluster2.cli("train", MULTINODE_TASK=str(project / "multinode.yaml"))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert f"task file {project / 'multinode.yaml'}: nodes, nproc, script, args, env, stall_timeout" in res.stdout
    lines = re.findall(r"TASKRUN rank=(\d) world=4 sum=10 args=\['--tag', 'one'\] greeting=hello", res.stdout)
    assert sorted(lines) == ["0", "1", "2", "3"], res.stdout[-4000:]
