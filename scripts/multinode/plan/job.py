"""Step 2 of ``train``: the job checked against the cluster and planned, before anything runs.

Pure but for reading SCRIPT/WORKDIR on the control machine: the entry point (our trainer, or the user's
project), the GPU request against the inventory, and the launcher's plan (argv and env per node).
"""

from __future__ import annotations

from pathlib import Path

from multinode.core.config import LaunchSpec
from multinode.core.errors import UserError
from multinode.checks.gpu import plan_nproc
from multinode.core.inventory import Inventory
from multinode.plan.launchers import EntryPoint, LaunchPlan, launcher_for
from multinode.code.project import ResolvedProject, resolve_project

REPO_ROOT = Path(__file__).resolve().parents[3]
TRAINING_DIR = REPO_ROOT / "training"
OUR_ENTRY = "training/train.py"


def resolve_entry(spec: LaunchSpec) -> tuple[EntryPoint, list[tuple[Path, str]] | ResolvedProject]:
    """The entry point and what to sync: our trainer as [(local path, path under the node's code dir)],
    or the user's project (SCRIPT in WORKDIR, or a -m module), synced incrementally."""
    if spec.script is None:
        return EntryPoint(OUR_ENTRY, spec.args, ours=True), [(TRAINING_DIR, "training")]
    resolved = resolve_project(spec)
    return resolved.entry, resolved


def plan_job(inventory: Inventory, spec: LaunchSpec) -> tuple[LaunchPlan, list[tuple[Path, str]] | ResolvedProject]:
    """Validate the job against the cluster and plan it. No I/O beyond reading SCRIPT/WORKDIR locally."""
    inv = inventory.first(spec.nodes)
    if spec.uses_gpu and inv.accelerator == "none":
        raise UserError(
            f"MODE={spec.mode} needs GPU nodes but cluster {inv.cluster!r} has CPU nodes; "
            f"use MODE=cpu or MODE=mpi, or bring up a GPU cluster (make up PROVIDER=aws CLUSTER_TYPE=g4dn)"
        )
    if spec.uses_gpu:
        plan_nproc(inv, spec)
    entry, sync = resolve_entry(spec)
    return launcher_for(spec).plan(inv, spec, entry), sync
