"""Golden plans: the exact ``train --dry-run`` output of representative jobs, recorded before the package was
laid out anew (issue 20) and held identical after it.

Each case writes an inventory (host or container runtime, CPU or GPU nodes, SSH or SLURM) into a temporary
state directory and runs the CLI in-process, as ``make train DRY_RUN=1`` does; nothing connects anywhere.
Integration, not unit: a WORKDIR plan asks git which files it would send (a subprocess).
The recorded outputs live in ``tests/integration/golden/<case>.txt``; after an intended change of a plan,
``MULTINODE_GOLDEN_UPDATE=1 pytest tests/integration/test_golden_dry_run.py`` writes them anew (review the diff).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from multinode.cli import main
from multinode.core.inventory import Inventory, Node

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("MULTINODE_GOLDEN_UPDATE"))  # read before the cases clear MULTINODE_*
REPO = Path(__file__).resolve().parents[2]


def _inventory(n: int, *, runtime: str = "host", accelerator: str = "none", gpus: int = 0,
               image: str | None = None, extra: dict | None = None) -> Inventory:
    nodes = tuple(Node(name=f"node-{i}", hostname=f"dev-node-{i}", private_ip=f"10.200.7.{10 + i}", ssh_user="root",
                       ssh_port=22, host_key="ssh-ed25519 AAAAgolden", accelerator=accelerator,
                       accelerator_count=gpus) for i in range(n))
    return Inventory(cluster="dev", provider="local", nodes=nodes, subnet="10.200.7.0/24",
                     ssh_key="/state/dev/id_ed25519", known_hosts="/state/dev/known_hosts",
                     workdir="/state/dev/nodes/{node}", python="/repo/.venv/bin/python", runtime=runtime,
                     image=image, extra=extra or {})


CONTAINER = {"container_cli": "podman --root /var/lib/mn --runtime runc", "container_args": ["--ulimit", "nofile=4096"]}
SLURM = {"scheduler": "slurm", "slurm_partition": "debug", "slurm_mpi": "pmix"}
CPU3 = _inventory(3)
NVIDIA = _inventory(2, runtime="docker", accelerator="nvidia", gpus=4, image="acct.dkr.ecr/mn:cuda", extra=CONTAINER)
AMD = _inventory(2, runtime="docker", accelerator="amd", gpus=1, image="acct.dkr.ecr/mn:rocm", extra=CONTAINER)
CPU_DOCKER = _inventory(2, runtime="docker", image="multinode-cpu:latest", extra=CONTAINER)
SLURM3 = _inventory(3, extra=SLURM)

# case -> (inventory, train flags); every case has run id "golden".
CASES: dict[str, tuple[Inventory, list[str]]] = {
    "cpu-static": (CPU3, ["--nodes", "2"]),
    "cpu-torchrun": (CPU3, ["--nodes", "3", "--launcher", "torchrun"]),
    "cpu-nproc2": (CPU3, ["--nodes", "2", "--nproc", "2"]),
    "cpu-elastic": (CPU3, ["--nodes", "3", "--elastic", "2:3", "--max-restarts", "2"]),
    "mpi": (CPU3, ["--nodes", "3", "--mode", "mpi", "--nproc", "2"]),
    "gpu-docker-auto": (NVIDIA, ["--nodes", "2", "--mode", "gpu", "--nproc", "auto"]),
    "mpi-gpu-docker": (NVIDIA, ["--nodes", "2", "--mode", "mpi-gpu", "--nproc", "2"]),
    "gpu-amd-torchrun": (AMD, ["--nodes", "2", "--mode", "gpu", "--launcher", "torchrun"]),
    "cpu-docker": (CPU_DOCKER, ["--nodes", "2"]),
    "project": (CPU3, ["--nodes", "2", "--workdir", "{project}", "--script", "train.py", "--args", "--epochs 2",
                       "--setup", "pip install -r requirements.txt", "--env", "GOLDEN_TOKEN MODE_NAME=fast"]),
    "project-module-mpi": (CPU3, ["--nodes", "2", "--mode", "mpi", "--workdir", "{project}",
                                  "--script", "-m pkg.train --lr 0.1", "--env", "GOLDEN_TOKEN"]),
    "project-docker": (CPU_DOCKER, ["--nodes", "2", "--workdir", "{project}", "--script", "train.py",
                                    "--env", "GOLDEN_TOKEN"]),
    "slurm-cpu": (SLURM3, ["--nodes", "3"]),
    "slurm-mpi": (SLURM3, ["--nodes", "2", "--mode", "mpi", "--nproc", "2"]),
    "slurm-project": (SLURM3, ["--nodes", "2", "--workdir", "{project}", "--script", "train.py"]),
    # GRACE (docs/preemption.md): MULTINODE_GRACE for every rank, the guard, each launcher's own SIGKILL wait.
    "grace-project": (CPU3, ["--nodes", "2", "--workdir", "{project}", "--script", "train.py", "--grace", "30"]),
    "grace-torchrun": (CPU3, ["--nodes", "3", "--launcher", "torchrun", "--max-restarts", "1", "--grace", "30"]),
    "grace-mpi-project": (CPU3, ["--nodes", "2", "--mode", "mpi", "--workdir", "{project}", "--script", "train.py",
                                 "--grace", "30"]),
    "grace-slurm": (SLURM3, ["--nodes", "2", "--grace", "30"]),
}


def _project(root: Path) -> Path:
    """A small project with fixed contents (its dry run counts files and bytes)."""
    project = root / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("import sys\nprint('train', sys.argv[1:])\n")
    (project / "requirements.txt").write_text("numpy\n")
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "train.py").write_text("print('module')\n")
    return project


def dry_run(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    inventory, flags = CASES[case]
    home = tmp_path / "home"
    (home / "dev").mkdir(parents=True)
    for name in ("id_ed25519", "known_hosts"):
        (home / "dev" / name).write_text("")
    inventory = replace(inventory, ssh_key=str(home / "dev" / "id_ed25519"), known_hosts=str(home / "dev" / "known_hosts"))
    inventory.save(home / "dev" / "inventory.json")
    project = _project(tmp_path)
    for name in [k for k in os.environ if k.startswith("MULTINODE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MULTINODE_HOME", str(home))
    monkeypatch.setenv("GOLDEN_TOKEN", "s3cret-golden-value")
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--run-id", "golden", "--dry-run", *(f.replace("{project}", str(project)) for f in flags)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "s3cret-golden-value" not in captured.out + captured.err
    return captured.out.replace(str(tmp_path), "<tmp>").replace(str(REPO), "<repo>")


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_output_is_the_recorded_one(case, tmp_path, monkeypatch, capsys):
    out = dry_run(case, tmp_path, monkeypatch, capsys)
    golden = GOLDEN / f"{case}.txt"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert golden.exists(), f"no recorded output for {case}: run with MULTINODE_GOLDEN_UPDATE=1 once"
    assert out == golden.read_text()
