"""The bootstrap's runtime steps as Terraform renders them, run over REAL SSH on local nodes (network
namespaces, one sshd each), then read by the real readiness wait of `up`:

* the host runtime (no image) of a cpu node: the rendered section creates the virtualenv and runs pip for
  torch 2.13.0+cpu and docker/requirements.txt's pins; the ready marker records what it installed; Open MPI
  and mpi4py from that virtualenv then run a 2-rank allreduce on the node.
  What differs from EC2: apt is not run (a shared machine; the stand-in `apt_get` checks with dpkg that
  python3-venv, openmpi-bin and libopenmpi-dev are installed), and download.pytorch.org is unreachable
  here, so pip takes the same torch==2.13.0+cpu from this machine's local wheel folder (pip's own config)
  for Debian 12's Python 3.11 instead of Ubuntu 24.04's 3.12;
* the GPU smoke test at the end of a g4ad bootstrap (host runtime): the rendered section runs the real
  SMOKE_SCRIPT of multinode.checks.gpu against a stand-in `torch` that behaves as the ROCm 7.2 wheel does on a
  V520 (gfx1011 not in its arch list, "invalid device function" at the first kernel); the failed marker it
  writes makes the readiness wait fail naming the node and the arch. No GPU here: the stand-in is the
  only torch that runs; what the real wheel does on a V520 is documented in docs/aws.md, not seen.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest
from localcluster import bring_up, tear_down
from test_bootstrap import monkeypatch_module  # noqa: F401 (fixture)

from multinode.core.errors import NodeError
from multinode.providers.aws.readiness import Bootstrap, wait_ready
from multinode.ssh.runner import RemoteRunner

pytestmark = pytest.mark.integration

# torch 2.13.0+rocm7.2 as a V520 sees it: a HIP build whose arch list lacks gfx1011 (ROCm/rocBLAS issue
# 1331: no gfx1011 kernels), so the first kernel launch fails. The arch list is illustrative, not the wheel's.
STAND_IN_TORCH = '''
__version__ = "2.13.0+rocm7.2"
float32 = "float32"
class version:
    cuda = None
    hip = "7.2.53211"
class _Props:
    name = "AMD Radeon Pro V520"
    gcnArchName = "gfx1011:sramecc-:xnack-"
    major, minor = 10, 1
class cuda:
    is_available = staticmethod(lambda: True)
    get_arch_list = staticmethod(lambda: ["gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100"])
    device_count = staticmethod(lambda: 1)
    get_device_properties = staticmethod(lambda index: _Props())
    synchronize = staticmethod(lambda device=None: None)
class _Tensor:
    def reshape(self, *shape): return self
    def __mod__(self, other): return self
    def to(self, device): raise RuntimeError("HIP error: invalid device function\\nHIP kernel errors might be asynchronously reported")
def arange(*args, **kwargs): return _Tensor()
def ones(*args, **kwargs): return _Tensor()
def device(kind, index): return (kind, index)
'''


@pytest.fixture(scope="module")
def rendered(bootstrap_renderings, monkeypatch_module) -> dict[str, str]:  # noqa: F811
    return dict(bootstrap_renderings)  # rendered once per session (conftest.py)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = bring_up(tmp_path_factory.mktemp("mnhome"), 2, prefix="bt")
    try:
        yield cluster
    finally:
        tear_down(cluster)


def section(script: str, start: str, end: str) -> str:
    """The lines of ``script`` from the one starting with ``start`` up to (without) the one starting with ``end``."""
    lines = script.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i, line in enumerate(lines) if i > first and line.startswith(end))
    return "\n".join(lines[first:last]) + "\n"


def node_script(script: str, state: str, body: str) -> str:
    """``body`` (sections of the rendered ``script``) behind the script's own shell options and fail_with."""
    fail_with = section(script, "fail_with() {", "# --- TTL")
    return (f"set -Eeuo pipefail\nstate={shlex.quote(state)}\ninstall -d \"$state\"\n{fail_with}"
            "apt_get() { shift; dpkg -s \"$@\" >/dev/null; }  # stand-in: no apt on a shared machine\n" + body)


def boot(tmp_path) -> Bootstrap:
    cloud_init = tmp_path / "cloud-init"
    cloud_init.write_text("#!/bin/sh\necho 'status: done'\n")
    cloud_init.chmod(0o755)
    return Bootstrap(ready=f"{tmp_path}/{{node}}/ready", failed=f"{tmp_path}/{{node}}/failed",
                     log=f"{tmp_path}/{{node}}/bootstrap.log", cloud_init=str(cloud_init), tail_lines=5)


def _pinned_wheels(into) -> str:
    """docker/requirements.txt's wheels fetched here, where PyPI answers, for the node's pip, which reaches only this
    machine's local folders (they hold boto3 1.43.107, not the pinned 1.44.5): the find-links the node's pip is
    given, with the machine's own first."""
    import os
    import subprocess
    import sys

    from multinode.providers.aws.bootstrap_inputs import requirements_path

    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into), "-r",
                          str(requirements_path())], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    own = os.environ.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout
    return " ".join([*own.split(), str(into)])


def test_the_host_runtime_install_runs_on_a_node_and_mpi4py_works_from_it(rendered, cluster, tmp_path):
    script = rendered["cpu-host"]
    venv = tmp_path / "venv"
    host = section(script, "# --- the host runtime", "# --- the GPU").replace("venv=/opt/multinode/venv", f"venv={venv}")
    ready = section(script, "# Last: the ready marker", 'echo "multinode: bootstrap done')
    (tmp_path / "node-0").mkdir()
    (tmp_path / "host.sh").write_text(node_script(script, f"{tmp_path}/node-0", host + 'image=""\ngpus=0\n' + ready))
    inv = cluster.inventory()
    with RemoteRunner(inv) as runner:
        # PIP_RETRIES=0: download.pytorch.org does not resolve here; no backoff before the local wheel folder.
        # PIP_COMPILE=0 (pip's --compile off; PIP_NO_COMPILE=1 would set it on: pip stores an environment value
        # as the option's own, seen with pip 23.2 and 26.3): torch's thousands of modules are not byte-compiled at
        # install (the suite's time); the same files are installed, and Python compiles what it imports.
        links = shlex.quote(_pinned_wheels(tmp_path / "wheels"))
        done = runner.run_on("node-0", f"PIP_RETRIES=0 PIP_COMPILE=0 PIP_FIND_LINKS={links} bash {tmp_path}/host.sh "
                                       f"> {tmp_path}/node-0/bootstrap.log 2>&1", timeout=900)
        assert done.exit_code == 0, (tmp_path / "node-0" / "bootstrap.log").read_text()[-3000:]
        wait_ready(inv.first(1), runner, image=None, timeout=60, bootstrap=boot(tmp_path), poll=1)
        marker = dict(line.split("=", 1) for line in (tmp_path / "node-0" / "ready").read_text().splitlines())
        assert marker["image"] == "" and marker["runtime"] == f"host {venv}/bin/python"
        assert (marker["torch"], marker["cuda"], marker["hip"], marker["mpi4py"]) == ("2.13.0+cpu", "None", "None", "4.1.2")
        assert marker["mpirun"].startswith("mpirun (Open MPI) ")
        program = "from mpi4py import MPI; import torch; c = MPI.COMM_WORLD; print('sum', c.allreduce(c.rank + 1), torch.__version__)"
        mpirun = (f"OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "
                  f"--bind-to none --mca btl self,tcp {venv}/bin/python -c {shlex.quote(program)}")
        ran = runner.run_on("node-0", mpirun, timeout=120)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines().count("sum 3 2.13.0+cpu") == 2


def test_a_gpu_without_kernels_in_the_runtime_fails_up_naming_the_node_and_the_arch(rendered, cluster, tmp_path):
    script = rendered["g4ad-host"]
    stand_in = tmp_path / "site"
    (stand_in / "torch").mkdir(parents=True)
    (stand_in / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\nPYTHONPATH={stand_in} exec /usr/bin/python3 \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    smoke = section(script, "cat >\"$state/gpu_smoke.py\"", "# Last: the ready marker")
    assert "def report(**kw):" in smoke  # the real SMOKE_SCRIPT, as rendered
    (tmp_path / "node-1").mkdir()
    (tmp_path / "smoke.sh").write_text(node_script(script, f"{tmp_path}/node-1", f"venv={venv}\ngpus=1\n" + smoke))
    inv = cluster.inventory()
    with RemoteRunner(inv) as runner:
        done = runner.run_on("node-1", f"bash {tmp_path}/smoke.sh > {tmp_path}/node-1/bootstrap.log 2>&1", timeout=120)
        assert done.exit_code == 1, (tmp_path / "node-1" / "bootstrap.log").read_text()
        with pytest.raises(NodeError) as err:
            wait_ready(replace(inv, nodes=inv.nodes[1:]), runner, image=None, timeout=60, bootstrap=boot(tmp_path), poll=1)
    assert err.value.node == "node-1"
    assert err.value.message == (
        "bootstrap failed: the bootstrap failed: GPU smoke test: no_kernels on gfx1011 (AMD Radeon Pro V520): "
        "HIP error: invalid device function; torch 2.13.0+rocm7.2 built for gfx908,gfx90a,gfx942,gfx1030,gfx1100")
    assert str(err.value).startswith("node-1: bootstrap failed")
