"""The images pin what pyproject.toml pins: a job in a container runs the versions CI ran."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"


def project_pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(dep.split("==") for dep in deps)


def test_image_requirements_match_pyproject():
    lines = [line.split("#")[0].strip() for line in (DOCKER / "requirements.txt").read_text().splitlines()]
    image = dict(line.split("==") for line in lines if line)
    pins = project_pins()
    assert image == {name: pins[name] for name in ["numpy", "mpi4py", "scikit-learn", "PyYAML", "tqdm", "boto3"]}


def test_every_dockerfile_installs_the_pinned_torch():
    torch = project_pins()["torch"]
    for name in ["cpu", "cuda", "rocm"]:
        text = (DOCKER / name / "Dockerfile").read_text()
        versions = set(re.findall(r"^ARG TORCH_VERSION=(\S+)$", text, re.MULTILINE))
        assert versions == {torch}, f"docker/{name}/Dockerfile: ARG TORCH_VERSION={versions}, pyproject pins {torch}"


def dockerfile_args(name: str) -> dict[str, set[str]]:
    args: dict[str, set[str]] = {}
    for key, value in re.findall(r"^ARG (\w+)=(\S+)$", (DOCKER / name / "Dockerfile").read_text(), re.MULTILINE):
        args.setdefault(key, set()).add(value)
    return args


def test_cuda_image_is_pypis_cuda_13_build_on_the_cpu_images_debian():
    """Checked 2026-11-23 with `env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null pip download --no-deps
    torch==2.13.0`: PyPI's default Linux x86_64 torch 2.13.0 is the CUDA 13.0 build (requires
    nvidia-nccl-cu13==2.29.7); 2.13 has no +cu128 build (CUDA 12.8 was dropped in 2.12)."""
    text = (DOCKER / "cuda" / "Dockerfile").read_text()
    args = dockerfile_args("cuda")
    assert args["TORCH_INDEX_URL"] == {"https://pypi.org/simple"}
    assert '"torch==${TORCH_VERSION}"' in text  # no local version label: not +cu128, not +cpu
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\+cu\d+|cu128|nvidia/cuda", code)
    assert args["BASE_IMAGE"] == dockerfile_args("cpu")["BASE_IMAGE"] == {"debian:12-slim"}
    assert args["PYTHON_VERSION"] == dockerfile_args("cpu")["PYTHON_VERSION"]
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE) == ["${BASE_IMAGE}"]


def test_rocm_image_is_torch_for_rocm_7_2_on_a_complete_rocm_7_2_base():
    """PyTorch 2.13 ships ROCm 7.2 wheels (pytorch/pytorch PR 187075); the -complete rocm/dev image
    carries rocBLAS, MIOpen and RCCL, the plain one the HIP runtime only."""
    text = (DOCKER / "rocm" / "Dockerfile").read_text()
    args = dockerfile_args("rocm")
    (rocm,) = args["ROCM_VERSION"]
    assert re.fullmatch(r"7\.2(\.\d+)?", rocm)
    assert args["TORCH_ROCM"] == {"rocm7.2"}
    assert '"torch==${TORCH_VERSION}+${TORCH_ROCM}"' in text
    bases = [b for b in re.findall(r"^FROM (\S+)", text, re.MULTILINE) if b.startswith("rocm/")]
    assert bases and all(b == "rocm/dev-ubuntu-24.04:${ROCM_VERSION}-complete" for b in bases), bases
    assert "rocm6" not in text


def test_no_image_sets_an_mpi_parameter_that_mpiruns_command_line_overrides(make_inv):
    """Issue 27, 8: the ROCm image set OMPI_MCA_pml=ucx, which the planned `mpirun --mca pml ob1` silently
    overrode (Open MPI: the command line beats the environment). An image default that mpirun overrides is
    a setting nobody gets; the two must agree."""
    from conftest import plan_job
    from multinode.core.config import LaunchSpec

    inv = make_inv(2, runtime="docker", image="img:1")
    plan, _ = plan_job(inv, LaunchSpec(mode="mpi", nodes=2, run_id="r1"))
    argv = plan.commands[0].argv
    on_command_line = {argv[i + 1] for i, word in enumerate(argv) if word == "--mca"}
    assert "pml" in on_command_line
    for name in ["cpu", "cuda", "rocm"]:
        text = (DOCKER / name / "Dockerfile").read_text()
        in_image = set(re.findall(r"^\s*(?:ENV\s+)?OMPI_MCA_(\w+)=", text, re.MULTILINE))
        assert not in_image & on_command_line, (
            f"docker/{name}/Dockerfile sets OMPI_MCA_{sorted(in_image & on_command_line)} that mpirun's --mca overrides")
