"""ENV: environment variables for every rank (and for SETUP), kept out of sight.

``ENV="NAME OTHER=value"``: ``NAME`` alone takes its value from the caller's environment, ``NAME=value``
gives it inline. Contract:

* Values never appear in ``plan.json``, the dry run, logs or the summary: plans carry the names only and
  show ``NAME=***`` -- whatever the name, so a secret under an innocent name is masked too (names that
  look like secrets, :func:`looks_secret`, are additionally called out as such).
* Values never travel on a command line (visible in ``ps`` on the node): each node gets them in a 0600
  file of ``export`` lines, written over SSH's stdin into the run's directory on the node and sourced by the
  node's command; the file is removed when the run ends.
* Names the launchers own (``RANK``, ``MASTER_ADDR``, ``PYTHONPATH``...) are refused, each with what sets it
  (:data:`RESERVED`; under a given mode only what that mode sets): overriding them would break the launch
  contract silently.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from multinode.core.errors import UserError

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MASK = "***"
# Names ENV may not set, and why: what the launchers or multinode set, or what the launch itself needs.
# torch's env:// contract: torchrun, the static starter and mpirun's rank shell set all seven on every rank
# (plan/launchers: torchrun, static, mpirun; SLURM: torchrun, or the MPI step's task line).
ENV_CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
RESERVED: dict[str, str] = {
    **{name: "which the launcher sets on every rank (torch's env:// contract)" for name in ENV_CONTRACT},
    "MULTINODE_RUN_ID": "which multinode sets on every rank (the gang-stop and the stack capture find ranks by it)",
    "GLOO_SOCKET_IFNAME": "which the launcher sets on every rank (gloo pinned to the cluster network)",
    "NCCL_SOCKET_IFNAME": "which the launcher sets on every rank in MODE=gpu (NCCL pinned to the cluster network)",
    "PYTHONPATH": "which the launcher sets for a WORKDIR project (the project first); use SETUP to install packages",
    "PATH": "which the launch itself needs (the ENV file is sourced before it)",
    "VIRTUAL_ENV": "which SETUP sets to the node's own environment",
}
# Names reserved only in some modes: the modes whose launcher sets them (MODE=mpi-gpu starts ranks with
# mpirun, which does not set NCCL_SOCKET_IFNAME).
MODE_ONLY = {"NCCL_SOCKET_IFNAME": frozenset({"gpu"})}


def reserved_reason(name: str, mode: str | None = None) -> str | None:
    """Why ENV may not set ``name`` under ``mode`` (None: under some mode), or None when it may."""
    if name in MODE_ONLY and mode is not None and mode not in MODE_ONLY[name]:
        return None
    return RESERVED.get(name)


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str = field(repr=False)  # never in a repr, a log line or a plan

    @property
    def shown(self) -> str:
        return f"{self.name}={MASK}"


def parse_env(text: str | None, caller: Mapping[str, str], mode: str | None = None) -> tuple[EnvVar, ...]:
    """``ENV`` as given to make/the CLI -> variables; one-line UserError naming the bad entry (never a value).
    ``mode``: refuse only what that mode reserves (None: what any mode does, each with its reason)."""
    if not text or not text.strip():
        return ()
    try:
        items = shlex.split(text)
    except ValueError as err:
        raise UserError(f"ENV cannot be split like a shell line ({err}); check its quotes") from None
    found: dict[str, EnvVar] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not NAME.match(name):
            raise UserError(f"ENV entry {name!r} is not a variable name; use NAME or NAME=value, e.g. ENV=\"HF_TOKEN EPOCHS=3\"")
        reason = reserved_reason(name, mode)
        if reason:
            raise UserError(f"ENV names {name}, {reason}; choose another name")
        if name in found:
            raise UserError(f"ENV names {name} twice; give it once")
        if not sep:
            if name not in caller:
                raise UserError(f"ENV names {name} but {name} is not set in your environment; export it or give {name}=value")
            value = caller[name]
        if "\0" in value:
            raise UserError(f"ENV {name} holds a NUL byte, which no environment can carry")
        found[name] = EnvVar(name, value)
    return tuple(found.values())


def env_file_content(variables: Iterable[EnvVar]) -> str:
    """POSIX-sh ``export`` lines (sourced on the node; values quoted, never interpreted)."""
    return "".join(f"export {var.name}={shlex.quote(var.value)}\n" for var in variables)


def masked(variables: Iterable[EnvVar]) -> dict[str, str]:
    return {var.name: MASK for var in variables}
