"""The pre-flight GPU smoke test: planned per node, and every answer turned into one line naming the node."""

from __future__ import annotations

import json

import pytest

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.checks.gpu import SMOKE_SCRIPT, failure_line, smoke_commands
from multinode.plan.request import plan_nproc
from multinode.plan.launchers.base import collective_env
from conftest import plan_job
from multinode.plan.runtime import to_shell


def answer(**kw) -> str:
    return "some torch warning\nGPUCHECK " + json.dumps(kw) + "\n"


T4 = dict(torch="2.13.0", cuda="13.0", hip=None, archs=["sm_75", "sm_80", "sm_90"], gpus=1, name="Tesla T4", arch="sm_75")
V520 = dict(torch="2.13.0+rocm7.2", cuda=None, hip="7.2", archs=["gfx90a", "gfx942", "gfx1100"], gpus=1,
            name="AMD Radeon Pro V520", arch="gfx1011")


def test_smoke_is_planned_on_gpu_nodes_only_inside_the_runs_image(make_inv):
    inv = make_inv(2, runtime="docker", accelerator="nvidia", image="123.dkr.ecr.us-east-1.amazonaws.com/mn:cuda")
    commands = smoke_commands(inv, LaunchSpec(mode="gpu", nodes=2, run_id="r1"))
    assert sorted(commands) == ["node-0", "node-1"]
    line = to_shell(commands["node-1"], inv, "r1-gpucheck")
    assert "--gpus all" in line and "123.dkr.ecr.us-east-1.amazonaws.com/mn:cuda" in line
    assert "--name mn-r1-gpucheck-node-1" in line  # never the job's container name
    assert commands["node-1"].argv[-1] == "1" and SMOKE_SCRIPT in commands["node-1"].argv
    assert smoke_commands(make_inv(2), LaunchSpec(mode="gpu", nodes=2, run_id="r1")) == {}  # CPU nodes: nothing runs


def test_nproc_above_the_gpu_count_is_refused_before_anything_runs(make_inv):
    inv = make_inv(2, runtime="docker", accelerator="nvidia", image="x/cuda:1")
    with pytest.raises(UserError, match=r"^NPROC=2 but node-0 has 1 GPU\(s\).*NPROC=1 or fewer"):
        plan_job(inv, LaunchSpec(mode="gpu", nodes=2, nproc=2))
    plan_nproc(inv, LaunchSpec(mode="gpu", nodes=2, nproc=1))
    plan_nproc(inv, LaunchSpec(mode="gpu", nodes=2, nproc="auto"))
    assert smoke_commands(inv, LaunchSpec(mode="gpu", nodes=2, nproc="auto"))["node-0"].argv[-1] == "1"


@pytest.mark.parametrize("stdout, stderr, code, expected", [
    (answer(ok=True, **T4), "", 0, None),
    (answer(error="no_gpu", torch="2.13.0", cuda="13.0", hip=None, archs=[], devices=[]), "", 0,
     "node-1: no NVIDIA driver visible in the container (torch 2.13.0 with CUDA 13.0 sees no GPU; devices: none)"),
    (answer(error="no_gpu", torch="2.13.0+rocm7.2", cuda=None, hip="7.2", archs=[], devices=["dri"]), "", 0,
     "node-1: no AMD GPU visible (torch 2.13.0+rocm7.2 with ROCm 7.2 sees none; devices: dri); is the amdgpu driver loaded?"),
    (answer(error="no_gpu", torch="2.13.0+cpu", cuda=None, hip=None, archs=[], devices=[]), "", 0,
     "node-1: torch in img:1 is a CPU-only build (2.13.0+cpu); use an image with a CUDA or ROCm build of torch"),
    (answer(error="no_kernels", device=0, detail="HIP error: invalid device function", **V520), "", 0,
     "node-1: torch in img:1 has no kernels for gfx1011 (AMD Radeon Pro V520); it was built for gfx90a, gfx942, "
     "gfx1100: use a build for gfx1011 (docker/README.md)"),
    (answer(error="too_many_procs", want=4, **T4), "", 0,
     "node-1: NPROC=4 but the node has 1 GPU(s); use NPROC=1 or fewer (or NPROC=auto)"),
    (answer(error="wrong_matmul", device=0, detail="max error 3.0", **T4), "", 0,
     "node-1: a matmul on GPU 0 (Tesla T4) gave a wrong result (max error 3.0)"),
    (answer(error="no_torch", detail="ModuleNotFoundError: No module named 'torch'"), "", 0,
     "node-1: torch in img:1 cannot be imported (ModuleNotFoundError: No module named 'torch')"),
    ("", 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].', 125,
     "node-1: no NVIDIA driver visible in the container (the container engine cannot give it the GPU: docker: Error "
     "response from daemon: could not select device driver \"\" with capabilities: [[gpu]].); install the NVIDIA "
     "container toolkit or use the Deep Learning Base OSS Nvidia Driver AMI"),
    ("", "", 124, "node-1: the GPU smoke test did not finish within 115 s (a hung driver or device?)"),
    ("", "Unable to find image 'img:1' locally", 125, "node-1: the GPU smoke test could not run (Unable to find image 'img:1' locally)"),
])
def test_every_answer_is_one_line_naming_the_node(stdout, stderr, code, expected):
    line = failure_line("node-1", "img:1", code, stdout, stderr)
    assert line == expected
    assert line is None or "\n" not in line


ROCBLAS_ABORT = (
    "\nrocBLAS error: Cannot read /opt/venv/lib/python3.12/site-packages/torch/lib/rocblas/library/TensileLibrary.dat: "
    "No such file or directory for GPU arch : gfx1011\n List of available TensileLibrary Files : \n"
    '"/opt/venv/lib/python3.12/site-packages/torch/lib/rocblas/library/TensileLibrary_lazy_gfx90a.dat"\n'
    '"/opt/venv/lib/python3.12/site-packages/torch/lib/rocblas/library/TensileLibrary_lazy_gfx942.dat"\n')


def test_rocblas_aborting_the_process_is_named_as_missing_kernels_with_the_device_found_before():
    """rocBLAS without a library for the GPU aborts (exit 134) instead of raising: the answer is the device line
    printed before the compute, and rocBLAS's own text (the real run: tests/integration/test_gpucheck_local.py)."""
    device = "GPUCHECK-DEVICE " + json.dumps(V520) + "\n"
    assert failure_line("node-1", "img:1", 134, device, ROCBLAS_ABORT) == (
        "node-1: torch in img:1 has no kernels for gfx1011 (AMD Radeon Pro V520): rocBLAS aborted at the first matmul "
        "(it has kernels for gfx90a, gfx942); use a build for gfx1011 (docker/README.md)")
    # "Illegal seek" is the same failure (ROCm/rocBLAS issue 1339), and a run that died before the device line.
    seek = ROCBLAS_ABORT.replace("No such file or directory", "Illegal seek")
    assert failure_line("node-1", None, 134, "", seek).startswith(
        "node-1: the node's torch has no kernels for gfx1011 (its GPU): rocBLAS aborted")


def test_host_runtime_names_the_nodes_torch():
    out = answer(error="no_gpu", torch="2.13.0+cpu", cuda=None, hip=None, archs=[], devices=[])
    assert failure_line("node-0", None, 0, out, "").startswith("node-0: the node's torch is a CPU-only build")


def test_nccl_interface_is_an_exact_match_and_socket_tuning_is_left_to_nccl(make_inv):
    env, node_env = collective_env(make_inv(2, accelerator="nvidia"), LaunchSpec(mode="gpu", nodes=2))
    assert node_env["NCCL_SOCKET_IFNAME"].startswith("=$(ip ")  # "=ens5", never the prefix "ens5"
    assert not any(k.startswith(("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS")) for k in {**env, **node_env})
    assert "NCCL_SOCKET_IFNAME" not in collective_env(make_inv(2), LaunchSpec(mode="cpu", nodes=2))[1]
