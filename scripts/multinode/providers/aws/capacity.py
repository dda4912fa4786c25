"""Nodes EC2 refused, launched again elsewhere until EC2 takes them (the executor; where they go is
:mod:`multinode.providers.aws.placement`, what EC2's answer means :mod:`multinode.providers.aws.refusals`).

AWS's placement-group guide: a launch into an existing cluster placement group (a later node, a replacement) is more
likely to get ``InsufficientInstanceCapacity`` than one that makes the whole group at once; and capacity is per zone.
So a refused node is launched outside the group (same subnet and zone), then in the other zones that offer the type
(a subnet each, infra/ec2/network.tf), each move said in one line. ``up`` retries the refused nodes alone
(``-target``: what the first apply made stays as it is), then a refresh-only apply brings the outputs up to date (as
a replacement does). A quota refusal moves nothing: :class:`LaunchRefused` names the quota
(:func:`multinode.providers.aws.quotas.refused`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from multinode.core.errors import CapacityRefused
from multinode.providers.aws import quotas
from multinode.providers.aws.keys import write_secret
from multinode.providers.aws.placement import Layout, missing_nodes, next_move
from multinode.providers.aws.refusals import Refusal, refusal_in
from multinode.providers.aws.resent import once_more_if_resent
from multinode.providers.aws.settings import DEFAULT_INSTANCE_TYPES
from multinode.providers.aws.terraform import Terraform, TerraformFailed

APPLY = ("apply", "-input=false", "-auto-approve", "-no-color")


class LaunchRefused(CapacityRefused):
    """EC2 refused ``nodes`` and no move is left (every zone tried, or a quota): ``refusal`` is EC2's answer,
    ``detail`` what it means here, in words."""

    def __init__(self, nodes: list[int], refusal: Refusal, detail: str) -> None:
        super().__init__(f"{', '.join(f'node-{i}' for i in nodes)}: {detail}")
        self.nodes, self.refusal, self.detail = nodes, refusal, detail


def apply_all(terraform: Terraform, tf_dir: Path) -> None:
    """``terraform apply`` of the whole cluster (once more after a request the SDK sent twice:
    :mod:`multinode.providers.aws.resent`); the nodes EC2 refused launched elsewhere (module doc)."""
    try:
        once_more_if_resent(lambda: terraform(tf_dir, *APPLY))
    except TerraformFailed as err:
        nodes = json.loads((tf_dir / "terraform.tfvars.json").read_text())["nodes"]
        place(terraform, tf_dir, err, lambda: missing_nodes(state_list(terraform, tf_dir), nodes),
              lambda refused: terraform(tf_dir, *APPLY, *(f"-target=aws_instance.node[{i}]" for i in refused)))
        terraform(tf_dir, "apply", "-refresh-only", "-input=false", "-auto-approve", "-no-color")


def state_list(terraform: Terraform, tf_dir: Path) -> str:
    return terraform(tf_dir, "state", "list", "-no-color")


def place(terraform: Terraform, tf_dir: Path, failed: TerraformFailed, refused_now: Callable[[], list[int]],
          launch: Callable[[list[int]], object]) -> None:
    """After ``failed`` (an apply EC2 refused nodes in), move the nodes ``refused_now()`` names and ``launch`` them
    again, until EC2 takes them. Raises ``failed`` itself when it is no launch refusal; :class:`LaunchRefused` when
    no move is left (nothing more was changed)."""
    tried: dict[int, set[str]] = {}
    while True:
        refusal, refused = refusal_in(failed.output), refused_now()
        if refusal is None or not refused:
            raise failed
        tfvars = json.loads((tf_dir / "terraform.tfvars.json").read_text())
        layout = Layout.read(tfvars, state_list(terraform, tf_dir))
        for i in refused:
            tried.setdefault(i, set()).add(layout.zone_of(i) or "?")
        move = next_move(refusal, refused, layout, tried)
        if move is None:
            zones = sorted({z for i in refused for z in tried[i]})
            raise LaunchRefused(refused, refusal, _no_move(refusal, len(refused), tfvars, zones)) from None
        write_secret(tf_dir / "terraform.tfvars.json", json.dumps(move.layout.written(tfvars), indent=2))
        print(move.line, file=sys.stderr, flush=True)
        try:
            launch(refused)
            return
        except TerraformFailed as again:
            failed = again


def _no_move(refusal: Refusal, count: int, tfvars: dict, zones: list[str]) -> str:
    itype = tfvars.get("instance_type") or DEFAULT_INSTANCE_TYPES[tfvars["cluster_type"]]
    if refusal.quota:
        return quotas.refused(refusal.code, quotas.Need(itype, count, bool(tfvars.get("spot")), tfvars["region"]))
    return f"EC2 said {refusal.code} for {itype} in {', '.join(zones)} ({refusal.meaning})"


__all__ = ["APPLY", "LaunchRefused", "apply_all", "place", "state_list"]
