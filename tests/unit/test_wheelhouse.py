"""The wheelhouse plan: which wheels an offline image build gets, and the key that caches them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multinode.core.errors import UserError
from multinode.images.wheelhouse import SOURCES, plan_wheelhouse

DOCKER = Path(__file__).resolve().parents[2] / "docker"
MACHINE = {"PATH": "/usr/bin", "PIP_FIND_LINKS": "/opt/wheels", "PIP_CONSTRAINT": "/etc/c.txt"}


def plan(image: str, dockerfile: str | None = None, requirements: str | None = None, environ=None):
    return plan_wheelhouse(
        image,
        dockerfile if dockerfile is not None else (DOCKER / image / "Dockerfile").read_text(),
        requirements if requirements is not None else (DOCKER / "requirements.txt").read_text(),
        "/venv/bin/python", dict(environ or MACHINE))


def values(argv, flag):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_cuda_plan_takes_pypis_default_torch_with_the_machine_config_cleared():
    p = plan("cuda")
    assert p.requirements[0] == "torch==2.13.0"  # PyPI's default build is the CUDA 13.0 one: no +cuXXX label
    assert values(p.argv, "--index-url") == ["https://pypi.org/simple"]
    # pip's machine config adds a find-links folder whose 2.13.0+cpu would win: none of it may reach pip
    assert p.env["PIP_CONFIG_FILE"] == os.devnull
    assert "PIP_FIND_LINKS" not in p.env and "PIP_CONSTRAINT" not in p.env and p.env["PATH"] == "/usr/bin"
    assert values(p.argv, "--python-version") == ["3.11"] and values(p.argv, "--abi") == ["cp311"]
    platforms = values(p.argv, "--platform")
    # the tags of the wheels torch 2.13.0 pulls: torch 2_28, cuDNN 2_27, NCCL 2_18, nvshmem 2014/2_17
    for tag in ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_18_x86_64", "manylinux2014_x86_64"]:
        assert tag in platforms
    assert "manylinux_2_37_x86_64" not in platforms  # Debian 12 has glibc 2.36
    assert "--only-binary=:all:" in p.argv and "--dest" not in p.argv


def test_cpu_plan_takes_the_cpu_build_and_keeps_the_machine_config():
    p = plan("cpu")
    assert p.requirements[0] == "torch==2.13.0+cpu"
    assert values(p.argv, "--extra-index-url") == ["https://download.pytorch.org/whl/cpu"]
    assert p.env == MACHINE


def test_plans_list_the_image_requirements_after_torch():
    lines = [line.split("#")[0].strip() for line in (DOCKER / "requirements.txt").read_text().splitlines()]
    assert list(plan("cuda").requirements[1:]) == [line for line in lines if line]


def test_the_key_follows_every_input_and_nothing_else():
    base = plan("cuda")
    assert base.folder == f"cuda-{base.key}" and len(base.key) == 16
    assert plan("cuda", environ={**MACHINE, "HOME": "/elsewhere"}).key == base.key
    assert plan("cuda", requirements="numpy==2.4.6\n").key != base.key
    assert plan("cuda", dockerfile="ARG TORCH_VERSION=2.13.1\n").key != base.key
    assert plan("cpu").key != base.key


@pytest.mark.parametrize("image, dockerfile, message", [
    ("rocm", "ARG TORCH_VERSION=2.13.0\n", "IMAGE=rocm has no offline wheelhouse"),
    ("cuda", "FROM debian:12-slim\n", "must set one ARG TORCH_VERSION=<version>"),
    ("cuda", "ARG TORCH_VERSION=2.13.0\nARG TORCH_VERSION=2.12.0\n", "must set one ARG TORCH_VERSION"),
])
def test_bad_inputs_are_one_line_user_errors(image, dockerfile, message):
    with pytest.raises(UserError) as err:
        plan(image, dockerfile=dockerfile)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_every_wheelhouse_image_has_a_dockerfile_that_reads_it():
    for image in SOURCES:
        text = (DOCKER / image / "Dockerfile").read_text()
        assert "ARG OFFLINE=0" in text and "--no-index" in text, image
