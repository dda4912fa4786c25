"""The docker/ images, checked here without a Docker engine or a registry:

* hadolint on every Dockerfile under docker/ (zero findings; inline ignores carry a reason);
* ``make image`` refuses bad values with one line and exit 2;
* the CPU and CUDA images built for real by ``make image`` (buildah, chroot isolation) from an offline
  ``debootstrap --variant=minbase bookworm`` base tagged ``debian:12-slim``, offline from the wheelhouse
  ``make image`` fills once per machine (``multinode.images.wheelhouse``): pins checked (for CUDA: torch's
  CUDA 13.0 build, NCCL >= 2.29, sm_75 compiled in, cuDNN), MPI and sshd run;
* a 2-node local cluster per image with ``runtime=docker`` (podman) and ``multinode train --nodes 2``:
  MODE=cpu with the static launcher and with torchrun's agents (a container per node), and MODE=mpi
  (mpirun in the head's container, the other rank started through the image's sshd on port 2222):
  the digits trainer runs inside the containers (the CUDA build on CPU: there is no GPU here), and
  nothing of the run is left on any node.

Every run goes through ``make image``; buildah's layer cache (``--layers``) keeps an unchanged build to
seconds, so a changed Dockerfile, context file, Makefile recipe or build argument is always what runs.
Podman and buildah use a private store under ``MULTINODE_IMAGE_CACHE`` (default /var/tmp/multinode-images),
the wheels lie in its ``wheels/``. Measured on 2 shared cores (2026-11-23): cold (no base, wheels or
layers) ~1 min for the base, ~1.5 min to download the CUDA wheels (2.7 GB), 1-3 min for the cpu build,
4-7 min for the cuda build (5.6 GB image), then the jobs; warm, the whole file takes ~1.5 min (both
builds are layer-cache hits of a few seconds).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from localcluster import REPO, bring_up, tear_down

pytestmark = pytest.mark.integration

DOCKER = REPO / "docker"
HADOLINT = Path(sys.executable).parent / "hadolint"
CACHE = Path(os.environ.get("MULTINODE_IMAGE_CACHE", "/var/tmp/multinode-images"))
BASE = "docker.io/library/debian:12-slim"
REPOSITORY = "localhost/multinode-cpu"
# What podman needs on this machine (FIELD-NOTES): runc, and ulimits within the sandbox's hard limits.
RUN_ARGS = "--pull=never --ulimit nofile=4096:4096 --ulimit nproc=4096:4096"
# The official debian:12-slim sources (deb822), so the build sees what it would see from the registry.
DEBIAN_SOURCES = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(argv, **kw)


def pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(dep.split("==") for dep in deps)


# --- hadolint and make image: fast, no image needed ----------------------------------------------


def dockerfiles() -> list[Path]:
    return sorted(p for p in DOCKER.rglob("*") if p.is_file() and p.name.startswith("Dockerfile"))


def test_every_image_has_a_dockerfile_and_hadolint_finds_nothing():
    files = dockerfiles()
    assert {p.parent.name for p in files} >= {"cpu", "cuda", "rocm"}, files
    res = run([str(HADOLINT), "--no-color", "-f", "json", *map(str, files)])
    findings = json.loads(res.stdout or "[]")
    assert findings == [] and res.returncode == 0, "\n".join(
        f"{f['file']}:{f['line']} {f['code']} {f['message']}" for f in findings) or res.stderr


def test_every_hadolint_ignore_says_why():
    for path in dockerfiles():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*#\s*hadolint\s+ignore=", line):
                before = lines[i - 1].strip() if i else ""
                assert before.startswith("#") and "hadolint" not in before and len(before) > 10, (
                    f"{path.relative_to(REPO)}:{i + 1}: put the reason for '{line.strip()}' in a comment above it")


@pytest.mark.parametrize("args, message", [
    (["IMAGE=gpu"], "IMAGE=gpu is not an image; use IMAGE=cpu, IMAGE=cuda or IMAGE=rocm"),
    # PUSH=1 goes to the image the cluster runs (multinode.images.delivery): no cluster, nothing to push to.
    (["IMAGE=cpu", "PUSH=1"], "PUSH=1: cluster 'dev' is not up here, so no node runs an image to push to"),
])
def test_make_image_rejects_bad_values_in_one_line(args, message, tmp_path):
    res = run(["make", "-s", "--no-print-directory", "-C", str(REPO), "image", *args,
               "BUILDAH=false-buildah-must-not-run"], env={**os.environ, "MAKEFLAGS": "", "MULTINODE_HOME": str(tmp_path)})
    assert res.returncode == 2
    assert res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


@pytest.mark.parametrize("args, wheelhouse", [
    (["IMAGE=cpu"], True),
    (["IMAGE=cuda"], True),
    (["IMAGE=rocm"], False),  # Python 3.12 and PyTorch's ROCm index: pip reads the index in the build
    (["IMAGE=cuda", "WHEEL_CACHE="], False),
])
def test_make_image_builds_cpu_and_cuda_offline_from_the_wheel_cache(args, wheelhouse):
    cache = [] if "WHEEL_CACHE=" in args else ["WHEEL_CACHE=/tmp/wc"]
    res = run(["make", "-n", "--no-print-directory", "-C", str(REPO), "image", *args, *cache],
              env={**os.environ, "MAKEFLAGS": ""})
    assert res.returncode == 0, res.stderr
    image = args[0].split("=")[1]
    assert (f"-m multinode.images.wheelhouse {image} docker /tmp/wc" in res.stdout) == wheelhouse, res.stdout
    assert ("--build-arg OFFLINE=1" in res.stdout) == wheelhouse
    assert "--layers" in res.stdout  # buildah keeps its layer cache only with --layers


# --- the CPU and CUDA images, built for real through `make image` ----------------------------------


class Store:
    """Podman/buildah on a private store: overlay where the kernel allows it (a container of the
    1.5 GB image starts in ~2 s), else vfs (copies the whole rootfs per container, ~20 s)."""

    def __init__(self, cache: Path):
        self.cache = cache
        # Runtime state on tmpfs (gone at reboot, like the containers it describes); one per store,
        # since podman refuses a runroot recorded for another root.
        self.runroot = Path("/run") / f"multinode-images-{hashlib.sha256(str(cache).encode()).hexdigest()[:8]}"
        self.driver = "overlay"
        if run(self.podman + ["info"]).returncode != 0:
            self.driver = "vfs"

    def _cli(self, tool: str) -> list[str]:
        root = self.cache / f"storage-{self.driver}"
        return [tool, "--root", str(root), "--runroot", str(self.runroot), "--storage-driver", self.driver]

    @property
    def podman(self) -> list[str]:
        return self._cli("podman") + ["--runtime", "runc"]

    @property
    def buildah(self) -> list[str]:
        return self._cli("buildah")

    def image_id(self, image: str) -> str | None:
        res = run(self.podman + ["image", "inspect", "--format", "{{.Id}}", image])
        return res.stdout.strip() if res.returncode == 0 else None

    def exists(self, image: str) -> bool:
        return run(self.podman + ["image", "exists", image]).returncode == 0

    def tags(self, repository: str) -> list[str]:
        res = run(self.podman + ["images", "--format", "{{.Repository}}:{{.Tag}}", repository])
        return res.stdout.split()


def make_base(store: Store) -> None:
    """``debian:12-slim`` without a registry: debootstrap minbase, official apt sources, import."""
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        res = run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"])
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        for leftover in [*(rootfs / "var/cache/apt/archives").glob("*.deb"), rootfs / "etc/apt/sources.list"]:
            leftover.unlink()
        shutil.rmtree(rootfs / "var/lib/apt/lists")
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(DEBIAN_SOURCES)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        res = run(store.podman + ["import", "--change", 'CMD ["bash"]', "-", BASE], stdin=tar.stdout)
        tar.wait()
        assert res.returncode == 0 and tar.returncode == 0, res.stderr



def build_image(store: Store, kind: str) -> str:
    """``make image IMAGE=<kind>`` on every run, never a tag reused on a key of our own: whatever the
    build uses (Dockerfile, context, the Makefile recipe, build arguments, the wheels through their
    SHA256SUMS) is what gets tested, and buildah's layer cache (``--layers``) makes an unchanged
    build a run of cache hits. The wheels come from WHEEL_CACHE, filled once per machine."""
    tag = f"localhost/multinode-test-{kind}:latest"
    res = run(["make", "-s", "--no-print-directory", "-C", str(REPO), "image", f"IMAGE={kind}", f"TAG={tag}",
               f"WHEEL_CACHE={CACHE / 'wheels'}", "BUILD_ARGS=--pull=never", f"BUILDAH={shlex.join(store.buildah)}"],
              env={**os.environ, "MAKEFLAGS": ""})
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "no Docker engine: using buildah" in res.stdout and "--build-arg OFFLINE=1" in res.stdout, res.stdout[-2000:]
    return tag


def base_store() -> Store:
    """The private store, with the offline ``debian:12-slim`` base every image builds on (one build at a time per
    cache: the lock)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    store = Store(CACHE)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not store.exists(BASE):
            make_base(store)
    return store


@pytest.fixture(scope="module")
def store():
    return base_store()


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def image(request, store):
    """(kind, tag) of an image built by ``make image`` from the current tree."""
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tag = f"localhost/multinode-test-{request.param}:latest"
        before, started = store.image_id(tag), int(time.time())
        assert build_image(store, request.param) == tag
        if store.image_id(tag) != before:
            # Something changed: drop the layers of earlier builds that no tag refers to any more. The
            # cache of the next run is the tag's ancestors (both Dockerfiles are one stage, so none
            # of it is an untagged leaf); `until` also spares anything this build made.
            run(store.podman + ["image", "prune", "-f", "--filter", f"until={started}"])
    return request.param, tag


# What `import torch` must report in each image: the CPU build of the CPU index; PyPI's default build
# of 2.13.0, which is the CUDA 13.0 one (its __version__ carries +cu130, its wheel metadata does not).
TORCH_BUILDS = {
    "cpu": {"dist": "+cpu", "version": "+cpu", "cuda": None},
    "cuda": {"dist": "", "version": "+cu130", "cuda": "13.0"},
}
PROBE = """\
import importlib.metadata as md, json
import torch
from mpi4py import MPI
names = ['torch', 'numpy', 'mpi4py', 'scikit-learn', 'PyYAML', 'tqdm']
cuda = torch.version.cuda
print(json.dumps({
    'versions': {n: md.version(n) for n in names}, 'mpi': MPI.Get_library_version(),
    'torch': torch.__version__, 'cuda': cuda,
    # compiled into the build, asked without a GPU (there is none here)
    'nccl': list(torch.cuda.nccl.version()) if cuda else None,
    'arch': torch.cuda.get_arch_list() if cuda else [],
    'cudnn': torch.backends.cudnn.version() if cuda else None,
}))
"""


def test_image_carries_the_pinned_runtime_mpi_and_sshd(image, store, tmp_path):
    kind, tag = image
    res = run(store.podman + ["run", "--rm", *RUN_ARGS.split(), "--network=host", tag, "python3", "-c", PROBE])
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout.strip().splitlines()[-1])
    build = TORCH_BUILDS[kind]
    expected = {name: pins()[name] for name in ["torch", "numpy", "mpi4py", "scikit-learn", "PyYAML", "tqdm"]}
    expected["torch"] += build["dist"]
    assert found["versions"] == expected
    assert found["torch"] == pins()["torch"] + build["version"] and found["cuda"] == build["cuda"]
    if kind == "cuda":
        assert tuple(found["nccl"]) >= (2, 29), found  # NCCL 2.29.7 from nvidia-nccl-cu13
        assert "sm_75" in found["arch"], found  # g4dn's T4
        assert found["cudnn"] and found["cudnn"] >= 90000, found
    assert found["mpi"].startswith("Open MPI v4.1.4")

    # Two MPI ranks in one container (mpi4py over Open MPI's shared memory), as the image's user root.
    res = run(store.podman + ["run", "--rm", *RUN_ARGS.split(), "--network=host", tag,
                              "mpirun", "-np", "2", "--oversubscribe", "python3", "-m", "mpi4py.bench", "helloworld"])
    assert res.returncode == 0 and res.stdout.count("Hello, World!") == 2, res.stdout + res.stderr

    # sshd's config is valid with a node's host key mounted where the image expects it (nothing baked in).
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hostkey")], check=True)
    (tmp_path / "authorized_keys").write_text("")
    res = run(store.podman + ["run", "--rm", *RUN_ARGS.split(), "--network=none",
                              "-v", f"{tmp_path / 'hostkey'}:/etc/multinode/ssh_host_ed25519_key:ro",
                              "-v", f"{tmp_path / 'authorized_keys'}:/etc/multinode/authorized_keys:ro",
                              tag, "sh", "-c", "ls /etc/ssh/ssh_host_* 2>/dev/null; /usr/sbin/sshd -t -f /etc/multinode/sshd_config "
                              "&& /usr/sbin/sshd -T -f /etc/multinode/sshd_config | grep -x 'port 2222'"])
    assert res.returncode == 0 and res.stdout.strip() == "port 2222", res.stdout + res.stderr


@pytest.fixture(scope="module")
def docker_cluster(image, store, tmp_path_factory):
    """A 2-node local cluster whose jobs run in the image (podman, host network)."""
    _, tag = image
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), 2, prefix="img", options={
        "runtime": "docker", "image": tag, "container_cli": shlex.join(store.podman), "container_args": RUN_ARGS,
    })
    try:
        yield cluster
    finally:
        tear_down(cluster)


@pytest.mark.parametrize("mode, launcher, containers", [
    # ranks started by the orchestrator in a container on every node
    ("cpu", "static", ["node-0", "node-1"]),
    # torchrun's agents in a container on every node (what MAX_RESTARTS/ELASTIC jobs run)
    ("cpu", "torchrun", ["node-0", "node-1"]),
    # mpirun in the head's container; node-1's rank is started by the image's sshd (port 2222) in a container
    ("mpi", "auto", ["node-0", "node-1-sshd"]),
])
def test_train_runs_inside_the_containers_of_two_nodes(image, store, docker_cluster, mode, launcher, containers):
    res = docker_cluster.cli("train", "--nodes", "2", "--mode", mode, "--launcher", launcher, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    run_dir = docker_cluster.runs()[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["exit_codes"].values()) == {0}
    assert summary["result"]["world_size"] == 2 and summary["result"]["test_accuracy"] >= 0.95, summary
    assert "test accuracy: 0." in res.stdout
    assert ("torch.distributed.run" in (run_dir / "plan.json").read_text()) == (launcher == "torchrun")
    # It ran in the image: the run's containers started and were removed.
    names = [f"mn-{summary['run_id']}-{suffix}" for suffix in containers]
    events = run(store.podman + ["events", "--stream=false", "--since", "15m",
                                 "--format", "{{.Name}} {{.Status}}"]).stdout.splitlines()
    for name in names:
        assert f"{name} start" in events and f"{name} remove" in events, (name, events[-20:])
    # Nothing of the run is left: no container, no process on any node (sshd aside).
    left = run(store.podman + ["ps", "-a", "--format", "{{.Names}}"]).stdout.split()
    assert not [name for name in left if summary["run_id"] in name], left
    assert docker_cluster.job_processes() == {"node-0": [], "node-1": []}


def test_a_project_with_setup_and_env_runs_in_the_containers(image, docker_cluster, tmp_path):
    """SETUP builds each node's environment inside the image, and ENV reaches the ranks in their containers."""
    project = tmp_path / "proj"
    shutil.copytree(REPO / "tests/integration/project", project, ignore=shutil.ignore_patterns("__pycache__"))
    res = run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "termcolor==3.3.0", "-d", str(project / "wheels")])
    assert res.returncode == 0, res.stderr
    secret = "container-secret-5e1d"
    res = docker_cluster.cli("train", "--nodes", "2", "--workdir", str(project), "--script", "-m pkg.train",
                             "--setup", "pip install -r requirements.txt", "--env", "PROJECT_TOKEN PROJECT_MODE=fast",
                             PROJECT_TOKEN=secret, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert len(re.findall(r"PROJECT rank=\d world=2 .* sum=3 expected=3 ", res.stdout)) == 2, res.stdout[-3000:]
    deps = re.findall(r"DEP rank=(\d) termcolor=3\.3\.0 at=(\S+?/termcolor/__init__\.py)", res.stdout)
    assert len(deps) == 2 and all(f"/nodes/node-{rank}/env/" in path for rank, path in deps), deps
    token = hashlib.sha256(secret.encode()).hexdigest()[:16]
    assert len(re.findall(rf"ENVCHECK rank=\d token={token} ", res.stdout)) == 2, res.stdout[-3000:]
    assert secret not in res.stdout + res.stderr
    for path in docker_cluster.runs()[-1].rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    assert docker_cluster.job_processes() == {"node-0": [], "node-1": []}


def built_cpu_image() -> tuple[Store, str]:
    """(store, image) of the cpu image from the machine's cache (built there once, under the cache's lock)."""
    store = base_store()
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return store, build_image(store, "cpu")
