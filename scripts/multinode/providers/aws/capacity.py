"""No capacity in the cluster placement group: the refused nodes launched once more outside it (the executor;
which nodes may move is :func:`multinode.providers.aws.replace.outside_group`, pure).

AWS's placement-group guide: a launch into an existing cluster placement group (a later node, a replacement) is more
likely to get ``InsufficientInstanceCapacity`` than one that makes the whole group at once; the node then runs in the
same subnet and zone, with less bandwidth to the others. ``up`` retries the refused nodes alone (``-target``: what the
first apply made stays as it is), then a refresh-only apply brings the outputs up to date (as a replacement does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from multinode.providers.aws.keys import write_secret
from multinode.providers.aws.replace import capacity_code, instance_address, missing_nodes, outside_group
from multinode.providers.aws.terraform import Terraform, TerraformFailed

APPLY = ("apply", "-input=false", "-auto-approve", "-no-color")


def apply_all(terraform: Terraform, tf_dir: Path) -> None:
    """``terraform apply`` of the whole cluster; the nodes EC2 refused inside the group once more outside it."""
    try:
        terraform(tf_dir, *APPLY)
    except TerraformFailed as err:
        code = capacity_code(err.output)
        nodes = json.loads((tf_dir / "terraform.tfvars.json").read_text())["nodes"]
        listed = state_list(terraform, tf_dir)
        missing = missing_nodes(listed, nodes)
        if not code or not launch_outside_group(terraform, tf_dir, missing, code, listed):
            raise
        terraform(tf_dir, *APPLY, *(f"-target={instance_address(f'node-{i}')}" for i in missing))
        terraform(tf_dir, "apply", "-refresh-only", "-input=false", "-auto-approve", "-no-color")


def state_list(terraform: Terraform, tf_dir: Path) -> str:
    return terraform(tf_dir, "state", "list", "-no-color")


def launch_outside_group(terraform: Terraform, tf_dir: Path, refused: list[int], code: str | None,
                         listed: str | None = None) -> bool:
    """The nodes ``refused`` (indexes) added to ``outside_placement_group`` in terraform.tfvars.json, said in one
    line; False (nothing changed) when that cannot help (:func:`outside_group`). ``listed``: ``terraform state
    list`` when the caller has just read it."""
    tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())
    listed = state_list(terraform, tf_dir) if listed is None else listed
    outside = outside_group(listed, list(tfvars.get("outside_placement_group", [])), refused)
    if outside is None:
        return False
    tfvars["outside_placement_group"] = outside
    write_secret(tf_dir / "terraform.tfvars.json", json.dumps(tfvars, indent=2))
    names = ", ".join(f"node-{i}" for i in refused)
    print(f"{names}: no capacity in the cluster placement group (EC2 said {code or 'no capacity'}); launching "
          f"{'it' if len(refused) == 1 else 'them'} outside the group (same subnet and zone, less bandwidth to "
          "the others)", file=sys.stderr, flush=True)
    return True
