"""multinode as a tool you install (issue 36): the built wheel in a fresh virtual environment, run from a project
directory outside the checkout.

The wheel is built once per module from a copy of the checkout's files (``pip wheel --no-deps
--no-build-isolation``: this environment's setuptools, no index; the copy keeps ``build/`` and ``*.egg-info`` out
of the checkout). The virtual environment is fresh and has no pip of its own: this environment's pip installs the
wheel into it (``pip --python``) with ``--no-deps``, before anything else is on its path, so pip sees only the
new environment. Then one ``.pth`` line gives it this environment's site-packages for the dependencies -- torch,
fabric, boto3... are 1 GB that pip would otherwise copy or download for every run -- without running that
directory's ``.pth`` files: the checkout's editable install (its finder maps ``multinode`` to scripts/ and, before
issue 36, ``training`` to training/) never runs, so ``multinode`` is the wheel's and ``import training`` fails.
Every command runs with a clean environment (no PYTHONPATH, no MULTINODE_*) in a temporary project directory.

What runs: ``multinode up`` of 2 local nodes (state in the project's ``.multinode/``), ``multinode train`` with the
bundled trainer (synced from the install, >= 95 % test accuracy), a user script given torchrun's way
(``train script.py --value 3``) and a module (``train -m pkg.job --value 2``), ``multinode down``, then nothing of
the cluster on the host (leakcheck.py). For ``PROVIDER=aws``, against a real moto_server and the real Terraform
binary (offline, terraform_offline.py): ``multinode up --provider aws`` prints its cost from the installed
prices and refuses without a confirmation, creating nothing; and the Terraform module the installed tool copies
for ``up`` (its own ``module_dir()``) plans 2 nodes with the bootstrap inputs the installed tool computes. Times
are never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import leakcheck
from localcluster import REPO, Cluster, new_cluster_name
from motoserver import moto_server
from terraform_offline import require_terraform, terraform_env

pytestmark = pytest.mark.integration

SHIPPED = ("pyproject.toml", "scripts", "training", "infra", "docker")  # what the wheel is built from
REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's built-in images (as test_aws_moto.py)
JOBS = Path(__file__).parent / "jobs"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout's files (tracked, and untracked ones git does not ignore)."""
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "--", *SHIPPED],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (built,) = out.glob("multinode-*.whl")
    return built


@dataclass(frozen=True)
class Venv:
    root: Path
    project: Path  # the user's project directory: the working directory of every command

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """A user's shell with the environment activated: nothing of the checkout or of a make run."""
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith("MULTINODE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return {**keep, "PATH": f"{self.root / 'bin'}:{keep.get('PATH', '/usr/bin:/bin')}",
                "VIRTUAL_ENV": str(self.root), "PYTHONUNBUFFERED": "1", **extra}

    def run(self, *argv: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=self.project, env=self.env(**extra), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def multinode(self, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
        return self.run(str(self.root / "bin" / "multinode"), *args, timeout=timeout, **extra)


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Venv:
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    bare = Venv(root, tmp_path_factory.mktemp("myproject"))
    # Without this environment's PYTHONPATH (the checkout's scripts/), pip would find multinode installed already.
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                          str(wheel)], capture_output=True, text=True, timeout=300, env=bare.env())
    assert res.returncode == 0 and "Successfully installed multinode-" in res.stdout, res.stdout + res.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "reach-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    project = bare.project
    assert REPO not in project.parents
    shutil.copy(JOBS / "user_allreduce.py", project / "allreduce.py")
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    shutil.copy(JOBS / "user_allreduce.py", project / "pkg" / "job.py")
    return Venv(root, project)


def test_the_wheel_ships_the_trees_inside_the_package_and_no_top_level_training(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "infra", "docker", "training"],
                             capture_output=True, text=True, check=True).stdout.split()
    expected = {f"multinode/{'trainer' + name[len('training'):] if name.startswith('training/') else name}"
                for name in tracked if not name.endswith(".gitignore")}
    assert expected <= names, sorted(expected - names)
    assert "multinode/infra/ec2/.terraform.lock.hcl" in names and "multinode/trainer/train.py" in names
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"multinode"}, tops


def test_the_install_is_what_runs_and_training_is_not_importable(venv):
    res = venv.run(str(venv.python), "-c", "import training")
    assert res.returncode == 1 and "ModuleNotFoundError: No module named 'training'" in res.stderr, res.stderr
    where = venv.run(str(venv.python), "-c", "import multinode, multinode.trainer.preempt as p, torch; "
                     "from multinode.core.resources import infra_dir, trainer_dir; "
                     "print(multinode.__file__, p.__file__, infra_dir(), trainer_dir())")
    assert where.returncode == 0, where.stderr
    assert all(str(venv.root) in path for path in where.stdout.split()), where.stdout
    guard = venv.run(str(venv.python), "-m", "multinode.trainer.guard", "--grace", "1", "--", "sh", "-c", "exit 7",
                     MULTINODE_NOTICES="off")
    assert guard.returncode == 7, guard.stderr  # the guard as docs/preemption.md names it for an installed tool
    help_ = venv.multinode("--help")
    assert help_.returncode == 0 and "multinode train train.py --epochs 3" in help_.stdout
    assert "parsing only" not in help_.stdout


def test_up_train_down_from_a_project_directory(venv):
    """The whole loop with the installed tool, state in the project's .multinode/, then nothing left on the host."""
    leakcheck.require_root()
    name = new_cluster_name("whl")
    home = venv.project / ".multinode"
    cluster = Cluster(name, home)  # read-only views of the state (inventory, runs) for the checks
    up = venv.multinode("--cluster", name, "up", "--nodes", "2", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    assert (home / name / "inventory.json").is_file()
    try:
        res = venv.multinode("--cluster", name, "train", timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert f"sync {venv.root}" in res.stdout and "/multinode/trainer (" in res.stdout, res.stdout[:3000]
        summary = json.loads((cluster.runs()[-1] / "summary.json").read_text())
        assert summary["result"]["test_accuracy"] >= 0.95 and summary["result"]["world_size"] == 2, summary
        script = venv.multinode("--cluster", name, "train", "--nodes", "2", "allreduce.py", "--value", "3")
        assert script.returncode == 0, script.stdout[-3000:] + script.stderr
        assert script.stdout.count("sum=9 expected=9") == 2, script.stdout[-3000:]
        module = venv.multinode("--cluster", name, "train", "--nodes", "2", "-m", "pkg.job", "--value", "2")
        assert module.returncode == 0, module.stdout[-3000:] + module.stderr
        assert module.stdout.count("sum=6 expected=6") == 2, module.stdout[-3000:]
        assert leakcheck.job_processes(name, home) == {"node-0": [], "node-1": []}
    finally:
        marks = leakcheck.marks(name, home)  # its run ids and namespaces, while they exist
        down = venv.multinode("--cluster", name, "down", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    leakcheck.assert_nothing_left(marks)
    assert [p.name for p in (home / name).iterdir()] == ["runs"]  # the runs' logs stay, as after any down


@pytest.fixture(scope="module")
def moto_url():
    with moto_server(MOTO_IAM_LOAD_MANAGED_POLICIES="true") as url:
        yield url


PLAN_INPUTS = """
import json
from multinode.core.config import ClusterSpec
from multinode.providers.aws.bootstrap_inputs import bootstrap_tfvars
from multinode.providers.aws.settings import AwsSettings, prices_path
from multinode.providers.aws.terraform import module_dir
spec = ClusterSpec(name="wheelaws", provider="aws", nodes=2, options={"region": "us-east-1", "ssh_cidr": "203.0.113.4/32"})
print(json.dumps({"module": str(module_dir()), "prices": str(prices_path()),
                  "tfvars": bootstrap_tfvars(spec, AwsSettings.from_spec(spec))}))
"""


def test_provider_aws_from_the_install_against_moto(venv, moto_url, tmp_path):
    terraform = require_terraform()
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": moto_url, "AWS_EC2_METADATA_DISABLED": "true"}
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"), timeout=60).close()

    # `up` prices the cluster from the installed infra/prices.json, then asks; with no terminal and no --yes it stops.
    up = venv.multinode("--cluster", "wheelaws", "up", "--provider", "aws", "--nodes", "2", "-o", f"region={REGION}",
                        "-o", "ssh_cidr=203.0.113.4/32", **aws)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "/h" in up.stdout and "c6i" in up.stdout, up.stdout
    assert up.stderr.strip() == "multinode: creating billable instances needs a confirmation; run 'make up YES=1' (or --yes)"
    assert not (venv.project / ".multinode" / "wheelaws").exists()

    # What `up` hands Terraform, from the install: its module and its bootstrap inputs; planned against moto.
    inputs = venv.run(str(venv.python), "-c", PLAN_INPUTS, **aws)
    assert inputs.returncode == 0, inputs.stderr
    found = json.loads(inputs.stdout)
    assert all(found[key].startswith(str(venv.root)) for key in ("module", "prices")), found
    assert found["tfvars"]["host_requirements"], found  # docker/requirements.txt, read from the install
    work = tmp_path / "ec2"
    shutil.copytree(found["module"], work)
    from multinode.providers.aws.keys import new_ed25519

    keys = [new_ed25519(f"cpu-demo-node-{i}") for i in range(2)]
    (work / "up.auto.tfvars.json").write_text(json.dumps({
        "ssh_cidr": "203.0.113.4/32", **found["tfvars"],
        "host_keys": [{"private_key": private, "public_key": public} for private, public in keys]}))
    env = {**os.environ, **aws, **terraform_env(tmp_path), "TF_VAR_ami_id": AMI, "TF_VAR_placement_group": "false"}

    def tf(*args: str) -> str:
        res = subprocess.run([terraform, f"-chdir={work}", *args, "-no-color"], capture_output=True, text=True,
                             env=env, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res.stdout

    tf("init", "-input=false", "-lockfile=readonly")
    tf("plan", "-input=false", "-var-file=examples/cpu.tfvars", "-out=plan.bin")
    plan = json.loads(tf("show", "-json", "plan.bin"))
    changes = {r["address"]: r["change"]["actions"] for r in plan["resource_changes"]}
    assert {"aws_instance.node[0]", "aws_instance.node[1]"} <= set(changes) and "aws_instance.node[2]" not in changes
    assert {tuple(actions) for actions in changes.values()} == {("create",)}
