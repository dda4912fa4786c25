"""An installed package's script runs: SCRIPT pointing into this project's own ``.venv`` site-packages, a directory
the project's git work tree ignores, is sent as a plain directory (the script's own package directory, not the
whole site-packages) and runs on 2 real local nodes; the sync line says which rule chose the files."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import certifi
import pytest

from localcluster import REPO, Cluster

pytestmark = pytest.mark.integration


def test_a_script_in_the_projects_own_venv_runs_on_two_nodes(shared_cluster3: Cluster):
    script = Path(certifi.__file__).parent / "__main__.py"  # certifi's own script: prints where its bundle lies
    assert REPO in script.resolve().parents, f"the test runs in the project's own .venv, not {script}"
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(script.parent)])
    assert ignored.returncode == 0, "the project's work tree must ignore its .venv for this test to mean anything"
    res = shared_cluster3.cli("train", "--nodes", "2", "--script", str(script))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    printed = re.findall(r"^\[(node-\d)\] (?:\[rank\d\]: )?(/\S+/cacert\.pem)$", res.stdout, re.M)
    assert sorted(node for node, _ in printed) == ["node-0", "node-1"], res.stdout[-3000:]
    sync = [line for line in res.stdout.splitlines() if line.startswith(f"sync {script.parent.resolve()} (")]
    assert len(sync) == 1, res.stdout[-3000:]
    assert f"every file: a directory git ignores in {REPO}" in sync[0]
    sent = len([p for p in script.parent.rglob("*") if p.is_file() and "__pycache__" not in p.parts])
    assert re.search(rf"\({sent} files, ", sync[0]), sync[0]  # the package directory, nothing around it
    assert shared_cluster3.job_processes() == {f"node-{i}": [] for i in range(3)}


def test_an_ignored_script_in_a_project_names_the_directory_that_would_send_it(shared_cluster3: Cluster,
                                                                              tmp_path: Path):
    """WORKDIR given: the project's rules hold, and the refusal says how to send the ignored directory instead."""
    proj = tmp_path / "proj"
    (proj / "build").mkdir(parents=True)
    (proj / "build" / "gen.py").write_text("print('generated')\n")
    (proj / ".gitignore").write_text("build/\n")
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    before = shared_cluster3.runs()
    res = shared_cluster3.cli("train", "--nodes", "2", "--workdir", str(proj), "--script", "build/gen.py")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stdout[-2000:] + res.stderr
    assert "SCRIPT=build/gen.py is not synced" in lines[0] and f"WORKDIR={proj / 'build'}" in lines[0], lines[0]
    assert shared_cluster3.runs() == before
    res = shared_cluster3.cli("train", "--nodes", "2", "--script", str(proj / "build" / "gen.py"))
    assert res.returncode == 0 and re.search(r"^\[node-1\] (\[rank1\]: )?generated$", res.stdout, re.M), \
        res.stdout[-2000:] + res.stderr
