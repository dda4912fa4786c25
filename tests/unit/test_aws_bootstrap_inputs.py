"""What `up` passes to the node bootstrap, read as data from the repository: the GPU smoke test's source
(the very check `make train` runs) and the host runtime's pinned packages (the images' own list)."""

from __future__ import annotations

import pytest

from multinode.checks import gpu
from multinode.core.config import ClusterSpec
from multinode.core.errors import UserError
from multinode.providers.aws.bootstrap_inputs import gpu_smoke_script, host_requirements, requirements_path
from multinode.providers.aws.bootstrap_inputs import bootstrap_tfvars
from multinode.providers.aws.settings import AwsSettings


def test_the_smoke_script_is_the_one_make_train_runs():
    assert gpu_smoke_script() == gpu.SMOKE_SCRIPT


def test_host_requirements_are_docker_requirements_pins():
    pins = host_requirements()
    assert pins == [line.strip() for line in requirements_path().read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert all("==" in pin for pin in pins) and any(pin.startswith("mpi4py==") for pin in pins)


def test_a_file_without_the_smoke_script_is_one_line(tmp_path):
    broken = tmp_path / "gpu.py"
    broken.write_text("OTHER = 'x'\n")
    with pytest.raises(UserError, match="has no SMOKE_SCRIPT string"):
        gpu_smoke_script(broken)
    with pytest.raises(UserError, match=r"cannot read .*missing.txt \(the host runtime's package list\): No such file"):
        host_requirements(tmp_path / "missing.txt")


@pytest.mark.parametrize("kind, image, keys", [
    ("cpu", None, {"host_requirements"}),
    ("g4dn", None, {"host_requirements", "gpu_smoke_script"}),
    ("g4ad", "123456789012.dkr.ecr.us-east-1.amazonaws.com/multinode-rocm:1", {"image", "gpu_smoke_script"}),
])
def test_bootstrap_tfvars_per_kind_and_runtime(monkeypatch, kind, image, keys):
    monkeypatch.delenv("MULTINODE_IMAGE", raising=False)
    options = {"region": "us-east-1", "ssh_cidr": "203.0.113.4/32", **({"image": image} if image else {})}
    spec = ClusterSpec(name="c", provider="aws", cluster_type=kind, options=options)
    tfvars = bootstrap_tfvars(spec, AwsSettings.from_spec(spec))
    assert set(tfvars) == keys
    assert tfvars.get("image") == image


def test_the_modules_own_default_host_requirements_are_the_same_pins():
    """A hand-run `terraform apply` (no make up) gets infra/ec2's default list: boto3 included, which DATA and
    CHECKPOINT_URL need on the nodes (issue 47 item 7; before, the default lacked it)."""
    import hcl2
    from hcl2 import SerializationOptions

    from multinode.providers.aws.terraform import module_dir

    parsed = hcl2.loads((module_dir() / "variables.tf").read_text(),
                        serialization_options=SerializationOptions(strip_string_quotes=True, explicit_blocks=False))
    variables = {name: spec for block in parsed["variable"] for name, spec in block.items()}
    assert variables["host_requirements"]["default"] == host_requirements()
