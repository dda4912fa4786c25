"""Each setting of ``train`` from the first source that has it: flag > make variable > task file > default.

A flag is what was typed after ``multinode train``; a make variable reaches the CLI as ``MULTINODE_<NAME>``
(the Makefile exports only the variables the user gave, so its own defaults never hide a task file's value);
the task file is :mod:`multinode.core.taskfile`; the default is LaunchSpec's. Flags and variables are text and
are typed here with the same one-line errors as the task file's values (``NODES='x' must be a whole number``).

:class:`Settled` keeps where each value came from: ``DRY_RUN=1`` with a task file prints it after the plan.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multinode.core.config import DEFAULT_TRAIN_ARGS, LaunchSpec
from multinode.core.envvars import parse_env
from multinode.core.errors import UserError
from multinode.core.taskfile import KEYS, Key, TaskFile

FLAG, VARIABLE, TASK, DEFAULT = "flag", "make variable", "task file", "default"
NPROC_FORMS = "a number or auto (one process per GPU, 1 on CPU nodes)"
BOOLS = {"1": True, "yes": True, "true": True, "0": False, "no": False, "false": False}


@dataclass(frozen=True)
class Settled:
    """The settings of one run, typed, and for each key the source it came from."""

    values: Mapping[str, Any]  # only the keys some source gave
    origins: Mapping[str, str]  # key -> FLAG | VARIABLE | TASK | DEFAULT
    task: TaskFile | None = None

    def spec(self, environ: Mapping[str, str], **run: Any) -> LaunchSpec:
        """The LaunchSpec (validated there); a value error caused by the task file names the file and the key."""
        values = dict(self.values)
        if "args" not in values:
            values["args"] = () if values.get("script") else DEFAULT_TRAIN_ARGS
        try:
            values["env"] = parse_env(values.get("env"), environ, mode=values.get("mode", LaunchSpec.mode))
            return LaunchSpec(**values, **run)
        except UserError as err:
            raise self.located(err) from None

    def located(self, err: UserError) -> UserError:
        """``err`` prefixed with the task file and its keys that the message names (NODES -> nodes), if any."""
        from_task = [key.name for key in KEYS.values() if self.origins.get(key.name) == TASK
                     and re.search(rf"\b{key.variable}\b", str(err))]
        if not from_task or self.task is None:
            return err
        return UserError(f"{self.task.shown}: {', '.join(from_task)}: {err}")

    def describe(self, spec: LaunchSpec) -> str:
        """Where each value came from, one line per setting (ENV values never shown: names only)."""
        lines = [f"settings (flag > make variable > task file {self.task.shown if self.task else '(none)'} > default):"]
        for key in KEYS.values():
            lines.append(f"  {key.name:17} {_shown(key, spec):24} [{self._origin(key)}]")
        return "\n".join(lines)

    def _origin(self, key: Key) -> str:
        origin = self.origins.get(key.name, DEFAULT)
        if origin == FLAG:
            return f"flag --{key.name.replace('_', '-')}"
        if origin == VARIABLE:
            return f"make variable {key.variable} (MULTINODE_{key.variable})"
        if origin == TASK and key.name in self.task.implied:
            return "task file (its directory, as it names a script)"
        return origin


def _shown(key: Key, spec: LaunchSpec) -> str:
    value = getattr(spec, key.name)
    if key.name == "env":
        return " ".join(var.shown for var in value) or "-"
    if key.name == "args":
        return shlex.join(value) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value.strip().replace("\n", "\\n")  # a multi-line SETUP on one line
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def settle(flags: Mapping[str, str | None], environ: Mapping[str, str], task: TaskFile | None) -> Settled:
    """flags: the train flags as typed (None: not given), keyed like KEYS; environ: for MULTINODE_<VARIABLE>."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key in KEYS.values():
        flag, variable = flags.get(key.name), environ.get(f"MULTINODE_{key.variable}") or None
        if flag is not None:
            values[key.name], origins[key.name] = typed(key, flag), FLAG
        elif variable is not None:
            values[key.name], origins[key.name] = typed(key, variable), VARIABLE
        elif task is not None and key.name in task.values:
            values[key.name], origins[key.name] = task.values[key.name], TASK
    return Settled(values, origins, task)


def typed(key: Key, text: str) -> Any:
    """A flag's or a variable's text as the setting's type; errors name the make variable, as LaunchSpec's do."""
    source = key.variable
    if key.kind in ("int", "number") or (key.kind == "nproc" and text != "auto"):
        try:
            return int(text) if key.kind != "number" else float(text)
        except ValueError:
            what = {"number": "a number of seconds", "int": "a whole number"}.get(key.kind, NPROC_FORMS)
            raise UserError(f"{source}={text!r} must be {what}") from None
    if key.kind == "bool":
        if text.strip().lower() not in BOOLS:
            raise UserError(f"{source}={text!r} must be 1 or 0 (yes or no)")
        return BOOLS[text.strip().lower()]
    if key.kind == "args":
        try:
            return tuple(shlex.split(text))
        except ValueError as err:
            raise UserError(f"{source}={text!r} cannot be split like a shell line ({err}); check its quotes") from None
    return text

