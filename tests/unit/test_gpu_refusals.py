"""The GPU smoke test's refusals on real outputs: what docker and rocBLAS printed on users' machines, recorded in
tests/unit/fixtures/gpu_refusals (each file's source in its README), turned into the one line naming the node and
the cause -- the line that names it, not docker's trailing ``ERRO[0000]`` line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multinode.checks.gpu import failure_line

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_refusals"
V520 = dict(torch="2.13.0+rocm7.2", cuda=None, hip="7.2", archs=["gfx90a", "gfx942", "gfx1100"], gpus=1,
            name="AMD Radeon Pro V520", arch="gfx1011")


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_every_recorded_output_is_cited():
    readme = recorded("README.md")
    files = sorted(p.name for p in FIXTURES.iterdir() if p.name != "README.md")
    assert files and all(f"`{name}`" in readme for name in files), files


@pytest.mark.parametrize("name, expected", [
    ("docker-no-toolkit.stderr",
     'node-1: no NVIDIA driver visible in the container (the container engine cannot give it the GPU: docker: Error '
     'response from daemon: could not select device driver "" with capabilities: [[gpu]].); install the NVIDIA '
     "container toolkit or use the Deep Learning Base OSS Nvidia Driver AMI"),
    ("docker-no-kfd.stderr",
     "node-1: no AMD GPU devices (/dev/kfd, /dev/dri) on the node (docker: Error response from daemon: error "
     'gathering device information while adding custom device "/dev/kfd": no such file or directory.); is the '
     "amdgpu driver loaded?"),
])
def test_a_container_engine_refusal_is_named_by_its_own_line(name, expected):
    assert failure_line("node-1", "img:1", 125, "", recorded(name)) == expected


def test_rocblas_without_the_arch_names_it_and_the_libraries_it_has():
    line = failure_line("node-1", "img:1", 134, "", recorded("rocblas-gfx1201.stderr"))
    assert line == ("node-1: torch in img:1 has no kernels for gfx1201 (its GPU): rocBLAS aborted at the first matmul "
                    "(it has kernels for gfx908, gfx1102, gfx906, gfx1010, gfx90a, gfx1100, gfx900, gfx1101, gfx1012, "
                    "gfx1030, gfx942, gfx941, gfx940); use a build for gfx1201 (docker/README.md)")
    line = failure_line("node-1", "img:1", 134, "", recorded("rocblas-gfx1036.stderr"))
    assert line == ("node-1: torch in img:1 has no kernels for gfx1036 (its GPU): rocBLAS aborted at the first matmul; "
                    "use a build for gfx1036 (docker/README.md)")


def test_an_older_rocblas_that_names_no_arch_takes_the_arch_the_check_found():
    device = "GPUCHECK-DEVICE " + json.dumps(V520) + "\n"
    line = failure_line("node-1", None, 134, device, recorded("rocblas-rocm-5.4.stderr"))
    assert line == ("node-1: the node's torch has no kernels for gfx1011 (AMD Radeon Pro V520): rocBLAS aborted at the "
                    "first matmul; use a build for gfx1011 (docker/README.md)")
