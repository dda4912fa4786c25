"""Launcher registry. A mode picks a launcher; an unknown name lists the valid ones."""

from __future__ import annotations

from multinode.core.errors import UserError
from multinode.plan.launchers.base import EntryPoint, Launcher, LaunchPlan, NodeCommand
from multinode.plan.launchers.mpirun import MpirunLauncher
from multinode.plan.launchers.static import StaticLauncher
from multinode.plan.launchers.torchrun import TorchrunLauncher

LAUNCHERS: dict[str, type] = {"torchrun": TorchrunLauncher, "mpirun": MpirunLauncher, "static": StaticLauncher}
MODE_LAUNCHER = {"cpu": "torchrun", "gpu": "torchrun", "mpi": "mpirun", "mpi-gpu": "mpirun"}


def get_launcher(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]()
    except KeyError:
        raise UserError(f"unknown launcher {name!r}; valid launchers: {', '.join(LAUNCHERS)}") from None


def launcher_for_mode(mode: str) -> Launcher:
    return get_launcher(MODE_LAUNCHER[mode])


def launcher_for(spec) -> Launcher:
    """The spec's launcher: the mode's, or ``static`` instead of torchrun when the job needs no agents."""
    if MODE_LAUNCHER[spec.mode] == "torchrun" and not spec.agents:
        return get_launcher("static")
    return launcher_for_mode(spec.mode)


__all__ = ["EntryPoint", "LAUNCHERS", "LaunchPlan", "Launcher", "NodeCommand", "get_launcher", "launcher_for", "launcher_for_mode"]
