"""``make image PUSH=1``: push to the image the cluster runs, then have every node pull it.

A container cluster's nodes run the inventory's image reference (``IMAGE_REF`` at `up`), pulled once at boot;
``docker run`` never pulls an image it already has. So a push is delivered only when it goes to that very
reference and every node pulls it again (issue 27, item 5; before, ``PUSH=1`` pushed ``<repository>:<kind>``,
which no node ran).

    python -m multinode.images.delivery target <cluster> <kind>   ->  the reference to push to (the cluster's image)
    python -m multinode.images.delivery pull <cluster>            ->  every node pulls it; one line per node

A user mistake (no such cluster, a host-runtime cluster, an image kind the nodes do not run, a local-only
reference) is one line on stderr and exit code 2; a node that cannot pull is one line naming it, exit code 1.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

from multinode.core.errors import UserError
from multinode.core.inventory import Inventory
from multinode.core.state import ClusterState
from multinode.plan.runtime import container_cli, runtime_for

# The image kind each node's accelerator runs (docker/README.md; providers/aws/settings.DEFAULT_IMAGES).
KIND_OF_ACCELERATOR = {"none": "cpu", "nvidia": "cuda", "amd": "rocm"}
PULL_TIMEOUT = 1800.0  # seconds: a 5.6 GB CUDA image over a node's link


def registry_host(image: str) -> str | None:
    """The registry of a reference, None for a local-only tag (Docker's rule: the first path component is a
    host when it holds a '.' or a ':' or is 'localhost')."""
    first, sep, _ = image.partition("/")
    return first if sep and ("." in first or ":" in first or first == "localhost") else None


def push_target(inventory: Inventory, kind: str) -> str:
    """The reference ``make image IMAGE=<kind> PUSH=1`` pushes to: the one the cluster's nodes run."""
    name, fix = inventory.cluster, f"give the registry: make image IMAGE={kind} PUSH=1 ECR=<registry>"
    image = runtime_for(inventory).image()  # None: the nodes' own Python (the runtime says, not its name)
    if not image:
        raise UserError(f"cluster {name!r} runs jobs on the nodes' own Python, not in an image; {fix} "
                        "and 'make up ... IMAGE_REF=<registry>/<repository>:<tag>' to run one")
    kinds = sorted({KIND_OF_ACCELERATOR[node.accelerator] for node in inventory.nodes})
    if kind not in kinds:
        raise UserError(f"IMAGE={kind} but cluster {name!r} runs {image} on {'/'.join(kinds)} nodes; "
                        f"use IMAGE={kinds[0]}")
    if registry_host(image) is None:
        raise UserError(f"cluster {name!r} runs {image}, a local tag no registry holds; {fix}")
    return image


def pull_lines(inventory: Inventory) -> dict[str, str]:
    """Per node, the line that pulls the cluster's image (the node's container CLI and its options)."""
    line = f"{shlex.join(container_cli(inventory))} pull {shlex.quote(inventory.image or '')}"
    return {node.name: line for node in inventory.nodes}


def pull_everywhere(inventory: Inventory, out=None) -> int:
    """Every node pulls the cluster's image at once; one line per node; 0 when all did, else 1."""
    from multinode.ssh.runner import RemoteRunner  # SSH only for this verb: `target` runs without it

    out = out or sys.stdout
    with RemoteRunner(inventory, out=out) as runner:
        results = runner.run_each(pull_lines(inventory), timeout=PULL_TIMEOUT)
    failed = 0
    for name, res in results.items():
        if res.ok:
            print(f"{name}: pulled {inventory.image}", file=out)
            continue
        failed += 1
        why = (res.error or res.stderr.strip() or f"exit code {res.exit_code}").splitlines()[-1]
        print(f"{name}: could not pull {inventory.image}: {why}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    verb, cluster, kind = (args + ["", "", ""])[:3]
    try:
        if verb not in ("target", "pull"):
            raise UserError(f"{verb!r} is not a verb; use 'target <cluster> <kind>' or 'pull <cluster>'")
        state = ClusterState.for_cluster(cluster)
        if not state.inventory_path.exists():
            raise UserError(f"cluster {cluster!r} is not up here, so no node runs an image to push to; run "
                            f"'make up CLUSTER={cluster} ...' or give the registry: make image PUSH=1 ECR=<registry>")
        inventory = state.load_inventory()
        if verb == "target":
            print(push_target(inventory, kind))
            return 0
        return pull_everywhere(inventory)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
