"""Backends: who starts, watches and stops the job of a run (:class:`multinode.app.run.Run`).

* ``ssh``: the orchestrator runs each node's command over its SSH session (a launcher's plan per node);
* ``slurm``: the cluster's own scheduler runs one batch job (an sbatch script), followed on the login node.

A cluster's inventory names its scheduler (``extra["scheduler"]``); none means ``ssh``. Every backend has the
shape of :class:`multinode.backends.base.Backend`; :data:`BACKENDS` maps names to them. A new scheduler is one
package here with one class, registered below.
"""

from __future__ import annotations

from multinode.backends.base import Backend
from multinode.core.config import LaunchSpec
from multinode.core.inventory import Inventory
from multinode.core.registry import Registry

BACKENDS = Registry("scheduler", "schedulers", {
    "ssh": "multinode.backends.ssh.backend:SshBackend",
    "slurm": "multinode.backends.slurm.backend:SlurmBackend",
})


def backend_for(inventory: Inventory, spec: LaunchSpec) -> Backend:
    """The backend of the cluster's scheduler (``ssh`` when it has none), for ``spec``."""
    return BACKENDS.create(inventory.extra.get("scheduler") or "ssh", inventory, spec)
