"""A user's project (tests/integration/project: a package, a YAML file read by relative path, a requirements
file) on a real 3-node local cluster: WORKDIR sync, SETUP, ENV and -m modules under the static launcher,
torchrun and mpirun; incremental re-syncs; secrets kept out of every file; bad input refused in one line."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import Cluster

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "project"
REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_project-secret-8f3a1c"
SETUP = 'pip install -r requirements.txt && test "$PROJECT_MODE" = fast'  # ENV reaches SETUP too
ENV = "PROJECT_TOKEN PROJECT_MODE=fast"
# termcolor 3.3.0: a 7.7 kB pure-Python wheel, not in the cluster's environment (pip index versions, 2026-11-23).
PACKAGE = "termcolor==3.3.0"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the fixture (the tests edit it), with the wheel requirements.txt installs: local nodes have
    no network, so it is fetched from the registry here, on the control machine, like data for closed nodes."""
    root = tmp_path_factory.mktemp("user") / "proj"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", str(root / "wheels")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return root


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def synced(stdout: str) -> dict[str, tuple[int, int]]:
    """{node: (files sent, files deleted)} from the sync line."""
    found = re.findall(r"((?:node-\d+(?:\.\.node-\d+)?(?:, )?)+) sent (\d+) files? \((\d+) bytes\), deleted (\d+)",
                       stdout)
    out = {}
    for nodes, sent, _, deleted in found:
        for part in nodes.split(", "):
            first, _, last = part.partition("..")
            for i in range(int(first[5:]), int((last or first)[5:]) + 1):
                out[f"node-{i}"] = (int(sent), int(deleted))
    return out


def check_result(res: subprocess.CompletedProcess, cluster: Cluster, name: str) -> None:
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    # Not anchored at line ends: mpirun's --tag-output can glue the next rank's tag to a line.
    lines = re.findall(r"PROJECT rank=(\d) world=3 host=(\S+) sum=6 expected=6 weights=([\d.]+) name=([a-z]+)", res.stdout)
    assert sorted(rank for rank, *_ in lines) == ["0", "1", "2"], res.stdout[-4000:]
    assert {(rank, host) for rank, host, *_ in lines} == {(str(i), f"{cluster.name}-node-{i}") for i in range(3)}
    assert len({weights for *_, weights, _ in lines}) == 1  # gradients averaged: identical replicas
    assert {n for *_, n in lines} == {name}
    # termcolor comes from each node's own SETUP environment (rank i runs on node-i), not the cluster's.
    deps = re.findall(r"DEP rank=(\d) termcolor=3\.3\.0 at=(/\S+?/termcolor/__init__\.py)", res.stdout)
    assert len(deps) == 3 and all(f"/nodes/node-{rank}/env/" in path for rank, path in deps), deps
    envs = re.findall(r"ENVCHECK rank=\d token=([0-9a-f]{16}|unset) mode=([0-9a-f]{16}|unset)", res.stdout)
    assert envs == [(digest(SECRET), digest("fast"))] * 3, envs


def assert_secret_nowhere(cluster: Cluster, *texts: str) -> None:
    """Not in the output, nor in any file of any run directory (plan.json, logs, summary.json), nor left
    on a node (the ENV files are removed with the run)."""
    for text in texts:
        assert SECRET not in text
    for run in cluster.runs():
        for path in run.rglob("*"):
            assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    nodes = cluster.state.provider_dir / "nodes"
    assert not [p for p in nodes.glob("node-*/runs/*/env")], "an ENV file was left on a node"


def test_project_runs_under_every_launcher_and_resyncs_only_what_changed(cluster3: Cluster, project: Path):
    common = ("train", "--nodes", "3", "--workdir", str(project), "--setup", SETUP, "--env", ENV)
    files = len([p for p in project.rglob("*") if p.is_file()])

    # 1. LAUNCHER=static, a module: every file to every node, SETUP on every node.
    first = cluster3.cli(*common, "--launcher", "static", "--script", "-m pkg.train", PROJECT_TOKEN=SECRET)
    check_result(first, cluster3, "first")
    assert synced(first.stdout) == {f"node-{i}": (files, 0) for i in range(3)}, first.stdout[:2000]
    assert len(re.findall(r"^\[node-\d\] SETUP: pip install", first.stdout, re.M)) == 3
    assert '"PROJECT_TOKEN"' in (cluster3.runs()[-1] / "plan.json").read_text()  # the name only
    # The nodes' SETUP did not touch the cluster's own environment (the one this test runs in).
    assert subprocess.run([sys.executable, "-c", "import termcolor"], capture_output=True).returncode != 0

    # 2. Edit one file, delete another; torchrun, a script path: one file sent to each node, SETUP skipped.
    config = project / "config.yaml"
    config.write_text(config.read_text().replace("name: first", "name: second"))
    (project / ".multinodeignore").unlink()
    second = cluster3.cli(*common, "--launcher", "torchrun", "--script", "pkg/train.py", PROJECT_TOKEN=SECRET)
    check_result(second, cluster3, "second")
    assert "torch.distributed.run" in (cluster3.runs()[-1] / "plan.json").read_text()
    assert synced(second.stdout) == {f"node-{i}": (1, 1) for i in range(3)}, second.stdout[:2000]
    assert len(re.findall(r"^\[node-\d\] SETUP: inputs unchanged .*; skipped$", second.stdout, re.M)) == 3

    # 3. requirements.txt changed; MODE=mpi, a module: one file each, SETUP runs again on every node.
    with open(project / "requirements.txt", "a") as fh:
        fh.write("# changed\n")
    third = cluster3.cli(*common, "--mode", "mpi", "--script", "-m pkg.train", PROJECT_TOKEN=SECRET)
    check_result(third, cluster3, "second")
    assert synced(third.stdout) == {f"node-{i}": (1, 0) for i in range(3)}, third.stdout[:2000]
    assert len(re.findall(r"^\[node-\d\] SETUP: pip install", third.stdout, re.M)) == 3
    assert "skipped" not in third.stdout

    # The dry run: names and per-node counts, no value -- not even one given inline.
    dry = cluster3.cli("train", "--nodes", "3", "--workdir", str(project), "--script", "-m pkg.train",
                       "--nproc", "auto", "--dry-run", "--env", f"PROJECT_TOKEN={SECRET} PROJECT_MODE",
                       PROJECT_MODE="fast")
    assert dry.returncode == 0, dry.stderr
    assert "[node-2] env: PROJECT_TOKEN=***" in dry.stdout and "PROJECT_MODE=***" in dry.stdout
    assert "processes per node: node-0=1, node-1=1, node-2=1" in dry.stdout
    assert_secret_nowhere(cluster3, first.stdout, first.stderr, second.stdout, third.stdout, dry.stdout, dry.stderr)
    assert cluster3.job_processes() == {f"node-{i}": [] for i in range(3)}


def assert_refused(cluster: Cluster, res: subprocess.CompletedProcess, before: list[Path], *fragments: str) -> None:
    """One line, exit 2, no run directory, nothing running on any node, no ENV file left."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr
    assert len(lines) == 1, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert cluster.runs() == before
    assert cluster.job_processes() == {f"node-{i}": [] for i in range(3)}
    assert_secret_nowhere(cluster, res.stdout, res.stderr)


def test_bad_projects_are_refused_in_one_line_before_any_rank_starts(cluster3: Cluster, project: Path, tmp_path: Path):
    before = cluster3.runs()
    proj = str(project)
    res = cluster3.cli("train", "--workdir", str(tmp_path / "missing"), "--script", "-m pkg.train")
    assert_refused(cluster3, res, before, f"WORKDIR={tmp_path / 'missing'} does not exist")

    outside = REPO / "tests/integration/jobs/user_mpi.py"
    res = cluster3.cli("train", "--workdir", proj, "--script", str(outside))
    assert_refused(cluster3, res, before, f"SCRIPT={outside} is outside WORKDIR={proj}")

    # Not in WORKDIR, and not importable on node-0 either: found out after the sync, before any rank.
    res = cluster3.cli("train", "--nodes", "3", "--workdir", proj, "--script", "-m pkg.nope", "--env", ENV,
                       PROJECT_TOKEN=SECRET)
    assert_refused(cluster3, res, before, "SCRIPT=-m pkg.nope", "pkg/nope.py", "node-0's Python cannot import it")

    broken = f'[ "$(hostname)" != "{cluster3.name}-node-1" ] || {{ echo broken on purpose; exit 3; }}'
    res = cluster3.cli("train", "--nodes", "3", "--workdir", proj, "--script", "-m pkg.train", "--setup", broken,
                       "--env", ENV, PROJECT_TOKEN=SECRET)
    assert_refused(cluster3, res, before, "SETUP failed on node-1 (exit 3: broken on purpose)", "no rank was started")
    assert "PROJECT rank" not in res.stdout

    big = tmp_path / "big"
    big.mkdir()
    (big / "train.py").write_text("print('never runs')\n")
    (big / "blob.bin").write_bytes(b"\0" * (2 * 2**20))
    res = cluster3.cli("train", "--workdir", str(big), "--script", "train.py", "--workdir-limit-mb", "1")
    assert_refused(cluster3, res, before, f"WORKDIR={big} holds 2.0 MB", "over the 1 MB limit", "blob.bin (2.0 MB)")


def test_an_installed_module_runs_though_it_is_not_in_workdir(cluster3: Cluster, project: Path):
    res = cluster3.cli("train", "--mode", "mpi", "--nodes", "3", "--workdir", str(project),
                       "--script", "-m mpi4py.bench ringtest")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert re.search(r"^\[node-0\] \[rank0\]: time for 1 loops = \S+ seconds \(3 processes", res.stdout, re.M), res.stdout


def test_what_is_sent_from_a_plain_directory_and_from_a_git_work_tree(tmp_path: Path):
    """The selection behind every sync (git runs here for real, so this lives with the integration tests)."""
    from multinode.code.workdir import load_project

    def sent(root: Path) -> dict[str, int]:
        return {rel: entry.size for rel, entry in load_project(str(root)).manifest.files.items()}

    def make(root: Path) -> Path:
        for rel in ("train.py", "pkg/m.py", "pkg/__pycache__/m.cpython-311.pyc", ".venv/bin/python", "data/big.bin",
                    "notes.tmp", "ignored-by-git.log"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(rel)
        (root / ".multinodeignore").write_text("/data/\n*.tmp\n")
        (root / ".gitignore").write_text("*.log\n")
        (root / "link.py").symlink_to(root / "train.py")
        (root / "linked-dir").symlink_to(root / "pkg")
        return root

    plain = make(tmp_path / "plain")
    assert sorted(sent(plain)) == [".gitignore", ".multinodeignore", "ignored-by-git.log", "link.py", "pkg/m.py",
                                   "train.py"]
    repo = make(tmp_path / "repo")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "train.py"], check=True)  # the rest is untracked
    assert sorted(sent(repo)) == [".gitignore", ".multinodeignore", "link.py", "pkg/m.py", "train.py"]
    assert sent(repo)["link.py"] == len("train.py")  # a link to a file travels as its content

    # A WORKDIR its work tree ignores is a plain directory (an installed package in the project's .venv).
    (repo / ".gitignore").write_text("*.log\n/vendored/\n")
    for rel in ("vendored/pkg/__init__.py", "vendored/pkg/run.py", "vendored/pkg/notes.log"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(rel)
    plain_inside = load_project(str(repo / "vendored" / "pkg"))
    assert sorted(plain_inside.manifest.files) == ["__init__.py", "notes.log", "run.py"]
    assert plain_inside.rule == f"every file: a directory git ignores in {repo.resolve()}"
    assert load_project(str(repo)).rule == f"git: tracked or not ignored in {repo.resolve()}"
    assert "vendored/pkg/run.py" not in load_project(str(repo)).manifest.files
    assert load_project(str(plain)).rule == "every file: not in a git work tree"
