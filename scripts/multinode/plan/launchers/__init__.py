"""Launcher registry. A mode picks a launcher; an unknown name lists the valid ones."""

from __future__ import annotations

from multinode.core.registry import Registry
from multinode.plan.launchers.base import EntryPoint, Launcher, LaunchPlan, NodeCommand

LAUNCHERS = Registry("launcher", "launchers", {
    "torchrun": "multinode.plan.launchers.torchrun:TorchrunLauncher",
    "mpirun": "multinode.plan.launchers.mpirun:MpirunLauncher",
    "static": "multinode.plan.launchers.static:StaticLauncher",
})
MODE_LAUNCHER = {"cpu": "torchrun", "gpu": "torchrun", "mpi": "mpirun", "mpi-gpu": "mpirun"}


def get_launcher(name: str) -> Launcher:
    return LAUNCHERS.create(name)


def launcher_for_mode(mode: str) -> Launcher:
    return get_launcher(MODE_LAUNCHER[mode])


def launcher_for(spec) -> Launcher:
    """The spec's launcher: the mode's, or ``static`` instead of torchrun when the job needs no agents."""
    if MODE_LAUNCHER[spec.mode] == "torchrun" and not spec.agents:
        return get_launcher("static")
    return launcher_for_mode(spec.mode)


__all__ = ["EntryPoint", "LAUNCHERS", "LaunchPlan", "Launcher", "NodeCommand", "get_launcher", "launcher_for", "launcher_for_mode"]
