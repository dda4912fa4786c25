"""Where ``make image IMAGE=<kind> PUSH=1`` pushes when no ``ECR=`` is given: the ECR repository of the
cluster (``CLUSTER``, default dev), as its inventory records it, tagged with the image kind.

    python -m multinode.providers.aws.ecr_target <cluster> <kind>   ->  <account>.dkr.ecr.<region>.amazonaws.com/<repo>:<kind>

One line on stderr and exit code 2 when the cluster has no AWS inventory.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState


def push_target(inventory: Inventory, kind: str) -> str:
    """``<repository url>:<kind>`` of an AWS cluster's inventory."""
    url = inventory.extra.get("ecr_repository_url") if inventory.provider == "aws" else None
    if not url:
        raise UserError(f"cluster {inventory.cluster!r} ({inventory.provider}) has no ECR repository; "
                        f"give the registry: make image IMAGE={kind} PUSH=1 ECR=<account>.dkr.ecr.<region>.amazonaws.com")
    return f"{url}:{kind}"


def main(argv: Sequence[str] | None = None) -> int:
    cluster, kind = (list(sys.argv[1:] if argv is None else argv) + ["", ""])[:2]
    try:
        state = ClusterState.for_cluster(cluster)
        if not state.inventory_path.exists():
            raise UserError(f"cluster {cluster!r} is not up here, so it has no repository to push to; run "
                            f"'make up PROVIDER=aws CLUSTER={cluster} ...' or give ECR=<account>.dkr.ecr.<region>.amazonaws.com")
        print(push_target(state.load_inventory(), kind))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
