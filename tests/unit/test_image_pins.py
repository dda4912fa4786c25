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
    assert image == {name: pins[name] for name in ["numpy", "mpi4py", "scikit-learn", "PyYAML", "tqdm"]}


def test_every_dockerfile_installs_the_pinned_torch():
    torch = project_pins()["torch"]
    for name in ["cpu", "cuda", "rocm"]:
        text = (DOCKER / name / "Dockerfile").read_text()
        versions = set(re.findall(r"^ARG TORCH_VERSION=(\S+)$", text, re.MULTILINE))
        assert versions == {torch}, f"docker/{name}/Dockerfile: ARG TORCH_VERSION={versions}, pyproject pins {torch}"
