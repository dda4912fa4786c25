"""One setting: its declaration and its kind (one parser per type).

A setting is declared once, where its value lives: on the spec's field
(``nodes: int = setting(2, WHOLE, "nodes taking part")``), or in :mod:`multinode.core.settings` for the few that
belong to a command rather than a spec. The declaration carries the kind, the default (the field's own), the
help, the make variable (read by the CLI as ``MULTINODE_<VARIABLE>``), whether ``make`` passes it on, and whether
it is a task-file key; the flag is ``--<name with dashes>``. Everything else (flags, task keys, the docs table,
the Makefile check) is derived in :mod:`multinode.core.settings`.

Contract of a kind: :meth:`Kind.text` types what a flag or a variable gave (text), :meth:`Kind.value` what a
task file gave (YAML, paths relative to the file's directory). Both raise :class:`Refused` naming what the value
should be; the caller names the source (``NODES='x' must be a whole number``, ``<file>: nodes: expected a whole
number, got 'x'``). A kind checks the form only; what a value means (a mode that exists, ``nodes >= 1``) is the
spec's ``__post_init__``, validated once.

Switches take one set of words, in any case: ``1``, ``yes``, ``true`` (on) and ``0``, ``no``, ``false`` (off);
in a task file also YAML's ``true``/``false``. Anything else is refused.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ON, OFF = ("1", "yes", "true"), ("0", "no", "false")
# How make passes a variable on (Setting.make): when given on its command line or in the environment (never the
# Makefile's own defaults, which would hide a task file's value), or only when given on make's command line.
GIVEN, COMMAND_LINE = "given", "command line"
SWITCH_WORDS = "1 or 0 (also yes/no, true/false)"


class Refused(ValueError):
    """The value is not of its setting's kind; ``expected`` says what it must be (``None``: ``message`` is whole).
    ``shown``: whether an error may show the value (never for ENV, which may hold secrets)."""

    def __init__(self, expected: str | None, message: str | None = None, shown: bool = True):
        super().__init__(expected or message)
        self.expected, self.message, self.shown = expected, message, shown


@dataclass(frozen=True)
class Kind:
    """A type of setting: its name (for the docs) and its two parsers."""

    name: str

    def text(self, text: str) -> Any:
        return text

    def value(self, value: object, base: Path) -> Any:
        if not isinstance(value, str):
            raise Refused("a string")
        return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true is an int to Python


def _scalar(value: object) -> bool:
    return isinstance(value, (str, float)) or _is_int(value)


class _Whole(Kind):
    def text(self, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise Refused("a whole number") from None

    def value(self, value: object, base: Path) -> int:
        if not _is_int(value):
            raise Refused("a whole number")
        return value


class _Seconds(Kind):
    def text(self, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise Refused("a number of seconds") from None

    def value(self, value: object, base: Path) -> float:
        if not (_is_int(value) or isinstance(value, float)):
            raise Refused("a number of seconds")
        return float(value)


class _Switch(Kind):
    def text(self, text: str) -> bool:
        word = text.strip().lower()
        if word not in ON + OFF:
            raise Refused(SWITCH_WORDS)
        return word in ON

    def value(self, value: object, base: Path) -> bool:
        if isinstance(value, bool):
            return value
        if (_is_int(value) and value in (0, 1)) or (isinstance(value, str) and value.strip().lower() in ON + OFF):
            return self.text(str(value))
        raise Refused("true or false")


class _Nproc(Kind):
    def text(self, text: str) -> int | str:
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise Refused("a number or auto (one process per GPU, 1 on CPU nodes)") from None

    def value(self, value: object, base: Path) -> int | str:
        if _is_int(value) or value == "auto":
            return value
        raise Refused("a number of processes per node or auto")


class _Args(Kind):
    def text(self, text: str) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(text))
        except ValueError as err:
            raise Refused(None, f"cannot be split like a shell line ({err}); check its quotes") from None

    def value(self, value: object, base: Path) -> tuple[str, ...]:
        if isinstance(value, list) and all(_scalar(item) for item in value):
            return tuple(str(item) for item in value)
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as err:
                raise Refused(None, f"cannot be split like a shell line ({err}); check its quotes or give a "
                                    f"list") from None
        raise Refused("a list of arguments or one string")


class _Env(Kind):
    """ENV's text (``NAME OTHER=value``), parsed with the caller's environment by :mod:`multinode.core.envvars`."""

    def value(self, value: object, base: Path) -> str:
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return shlex.join(value)
        if isinstance(value, dict) and all(isinstance(k, str) and (v is None or _scalar(v)) for k, v in value.items()):
            return shlex.join(k if v is None else f"{k}={v}" for k, v in value.items())
        raise Refused("a list of NAME or NAME=value, or a mapping NAME: value", shown=False)


class _Script(Kind):
    """A path (relative to a task file's directory) or ``-m package.module [args]``."""

    def value(self, value: object, base: Path) -> str:
        text = super().value(value, base)
        if text.lstrip().startswith("-m") or Path(text).expanduser().is_absolute():
            return text
        return str(base / text)


class _Path(Kind):
    def value(self, value: object, base: Path) -> str:
        return str((base / Path(super().value(value, base)).expanduser()).resolve())


class _Elastic(Kind):
    def value(self, value: object, base: Path) -> str:
        if not isinstance(value, str):  # YAML 1.1 reads 1:3 as a base-60 number
            raise Refused('MIN:MAX in quotes, e.g. elastic: "1:3" (unquoted, YAML reads 1:3 as a number)')
        return value


TEXT = Kind("text")
WHOLE = _Whole("whole number")
SECONDS = _Seconds("seconds")
SWITCH = _Switch("switch")
NPROC = _Nproc("number or auto")
ARGS = _Args("arguments")
ENV = _Env("variables")
SCRIPT = _Script("path or -m module")
PATH = _Path("path")
RANGE = _Elastic("MIN:MAX")  # ELASTIC's node range


@dataclass(frozen=True)
class Setting:
    """A setting as declared. ``name`` is the spec's field (and the task key, and ``--name-with-dashes``);
    ``variable`` the make variable and ``MULTINODE_<variable>`` (None: a flag only); ``make``: how the Makefile
    passes the variable on, GIVEN or COMMAND_LINE (None: it does not; the CLI reads ``MULTINODE_<variable>`` from
    the environment only); ``env``: the name after ``MULTINODE_`` when it is not the variable's (IMAGE_REF is
    MULTINODE_IMAGE)."""

    kind: Kind
    help: str
    name: str = ""
    default: Any = None
    variable: str | None = ""  # "": the name in upper case
    make: str | None = GIVEN
    task: bool = False
    flag: bool = True
    env: str | None = None
    metavar: str | None = None
    see: str = ""  # the docs' pointer, e.g. "[recovery.md](recovery.md)"

    @property
    def environ(self) -> str | None:
        """The environment variable the CLI reads, or None."""
        return f"MULTINODE_{self.env or self.variable}" if self.variable else None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


def setting(default: Any, kind: Kind, help: str, **declared: Any) -> Any:
    """A spec field declared as a setting (see :class:`Setting` for ``declared``); ``default`` is the field's."""
    factory = declared.pop("default_factory", None)
    meta = {"setting": Setting(kind, help, **declared)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
