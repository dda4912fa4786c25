"""Each setting of ``train`` from the first source that has it: flag > make variable > task file > default.

A flag is what was typed after ``multinode train``; a make variable reaches the CLI as ``MULTINODE_<NAME>``
(the Makefile exports only the variables the user gave, so its own defaults never hide a task file's value);
the task file is :mod:`multinode.core.taskfile`; the default is the declaration's (LaunchSpec's field). Flags and
variables are text, typed by their setting's kind (:mod:`multinode.core.setting`) with one-line errors naming the
variable (``NODES='x' must be a whole number``); :func:`value_of` does the same for the settings of other verbs.

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
from multinode.core.setting import Refused, Setting
from multinode.core.taskfile import KEYS, TaskFile

FLAG, VARIABLE, TASK, DEFAULT = "flag", "make variable", "task file", "default"


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

    def _origin(self, key: Setting) -> str:
        origin = self.origins.get(key.name, DEFAULT)
        if origin == FLAG:
            return f"flag {key.option}"
        if origin == VARIABLE:
            return f"make variable {key.variable} ({key.environ})"
        if origin == TASK and key.name in self.task.implied:
            return "task file (its directory, as it names a script)"
        return origin


def _shown(key: Setting, spec: LaunchSpec) -> str:
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
        given = pick(key, flags.get(key.name), environ)
        if given is not None:
            values[key.name], origins[key.name] = given
        elif task is not None and key.name in task.values:
            values[key.name], origins[key.name] = task.values[key.name], TASK
    return Settled(values, origins, task)


def pick(setting: Setting, flag: str | None, environ: Mapping[str, str]) -> tuple[Any, str] | None:
    """(the typed value, FLAG or VARIABLE) from the flag as typed or ``MULTINODE_<VARIABLE>`` (empty: not given);
    None when neither gave it."""
    if flag is not None:
        return typed(setting, flag), FLAG
    variable = environ.get(setting.environ) if setting.environ else None
    if variable:
        return typed(setting, variable), VARIABLE
    return None


def value_of(setting: Setting, flag: str | None, environ: Mapping[str, str]) -> Any:
    """flag > ``MULTINODE_<VARIABLE>`` > the setting's default, typed."""
    given = pick(setting, flag, environ)
    return setting.default if given is None else given[0]


def typed(key: Setting, text: str) -> Any:
    """A flag's or a variable's text as the setting's type (its kind's parser); errors name the make variable, as
    LaunchSpec's do: ``NODES='x' must be a whole number``."""
    try:
        return key.kind.text(text)
    except Refused as err:
        raise UserError(f"{key.variable}={text!r} {err.message or f'must be {err.expected}'}") from None
