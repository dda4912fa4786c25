"""A task file: what a run needs, kept next to the code instead of retyped as make variables.

``multinode.yaml`` in WORKDIR (or the file ``TASK=path`` names; a directory means its ``multinode.yaml``)
holds the settings of ``make train`` (SkyPilot keeps the same in a task YAML)::

    nodes: 2
    mode: cpu
    script: train.py                # or "-m pkg.train"
    args: [--epochs, "5"]           # or one string, split like a shell line
    setup: pip install -r requirements.txt
    env: [HF_TOKEN, EPOCHS=5]       # or a mapping; a name alone takes its value from your environment

Contract:

* The keys are :data:`KEYS`, one per setting of :class:`multinode.core.config.LaunchSpec` that describes the
  task (not the cluster, the run id or the dry run). An unknown key, a value of the wrong type or a file that
  is not YAML is one :class:`UserError` line naming the file and the key (a close match is suggested).
* Paths (``workdir``, a ``script`` path) are relative to the file's directory; ``workdir`` defaults to that
  directory when the file names a script.
* The values come back typed as LaunchSpec wants them (``args`` a tuple, ``env`` the text of ``ENV``); the
  values' own checks (a mode that does not exist, ``nodes: 0``) stay in LaunchSpec, validated once.
  Which source wins (flag > make variable > task file > default) is :mod:`multinode.core.sources`.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from multinode.core.errors import UserError

TASK_FILE = "multinode.yaml"


@dataclass(frozen=True)
class Key:
    """One setting: its name in the task file (= the LaunchSpec field), its make variable, its kind."""

    name: str
    variable: str  # the make variable, read by the CLI as MULTINODE_<variable>
    kind: str  # int | number | bool | text | nproc | args | env | script | path | elastic


KEYS: dict[str, Key] = {key.name: key for key in (
    Key("nodes", "NODES", "int"),
    Key("mode", "MODE", "text"),
    Key("nproc", "NPROC", "nproc"),
    Key("script", "SCRIPT", "script"),
    Key("args", "ARGS", "args"),
    Key("workdir", "WORKDIR", "path"),
    Key("workdir_limit_mb", "WORKDIR_LIMIT_MB", "int"),
    Key("setup", "SETUP", "text"),
    Key("env", "ENV", "env"),
    Key("launcher", "LAUNCHER", "text"),
    Key("max_restarts", "MAX_RESTARTS", "int"),
    Key("elastic", "ELASTIC", "elastic"),
    Key("rdzv_port", "RDZV_PORT", "int"),
    Key("rdzv_timeout", "RDZV_TIMEOUT", "int"),
    Key("pg_timeout", "PG_TIMEOUT", "int"),
    Key("deadline", "DEADLINE", "number"),
    Key("stall_timeout", "STALL_TIMEOUT", "number"),
    Key("skew", "SKEW", "text"),
    Key("linkcheck", "LINKCHECK", "text"),
    Key("grace", "GRACE", "number"),
    Key("resume", "RESUME", "bool"),
    Key("recover", "RECOVER", "int"),
    Key("recover_wait", "RECOVER_WAIT", "number"),
)}
# Keys a task file may be expected to have but that belong to the command line: where to give them instead.
ELSEWHERE = {
    "cluster": "the cluster is chosen per command: CLUSTER=name (make) or --cluster",
    "provider": "the provider is the cluster's: make up PROVIDER=...",
    "run_id": "a run id is per run: --run-id",
    "dry_run": "a dry run is per command: DRY_RUN=1 (make) or --dry-run",
    "queue": "waiting for a busy cluster is per command: QUEUE=1 (make) or --queue",
    "task": "a task file cannot name another one",
}


@dataclass(frozen=True)
class TaskFile:
    """A task file, read and type-checked: ``values`` holds only the keys it sets, typed for LaunchSpec."""

    path: Path  # absolute
    values: Mapping[str, Any]
    implied: frozenset[str] = frozenset()  # keys set by the rules above, not written in the file (workdir)

    @property
    def shown(self) -> str:
        return str(self.path)


def find_task(task: str | None, workdir: str | None) -> TaskFile | None:
    """The task file of this run: TASK (a file, or a directory holding multinode.yaml), else WORKDIR's
    multinode.yaml if there is one, else None. A TASK that names nothing readable is a UserError."""
    if task:
        path = Path(task).expanduser()
        if path.is_dir():
            path = path / TASK_FILE
        if not path.is_file():
            raise UserError(f"TASK={task}: no such file; give the path of a task file (or of a directory holding "
                            f"{TASK_FILE})")
        return load_task(path)
    if workdir and (Path(workdir).expanduser() / TASK_FILE).is_file():
        return load_task(Path(workdir).expanduser() / TASK_FILE)
    return None


def load_task(path: Path) -> TaskFile:
    """Read and type-check a task file (one-line UserError naming the file and the key)."""
    path = path.resolve()
    try:
        data = yaml.load(path.read_text(), Loader=_StrictLoader)  # a SafeLoader
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror}); check TASK") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; a task file is YAML (key: value per line)") from None
    except _DuplicateKey as err:
        raise UserError(f"{path}: {err} is given twice; keep one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path} is not valid YAML{where}: {problem}; fix the file (key: value per line)") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold keys and values (nodes: 2, script: train.py ...), "
                        f"not a {type(data).__name__}")
    values = {}
    for name, value in data.items():
        key = _key(path, name)
        if value is None:
            raise UserError(f"{path}: {key.name} has no value; give one or remove the line")
        values[key.name] = PARSE[key.kind](value, _Context(path, key))
    implied = frozenset({"workdir"}) if "script" in values and "workdir" not in values else frozenset()
    if implied:
        values["workdir"] = str(path.parent)
    return TaskFile(path, values, implied)


class _DuplicateKey(Exception):
    pass


class _StrictLoader(yaml.SafeLoader):
    """safe_load, but a key given twice is an error (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(f"{key!r} (line {key_node.start_mark.line + 1})")
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _key(path: Path, name: object) -> Key:
    if isinstance(name, str) and name in KEYS:
        return KEYS[name]
    if isinstance(name, str) and name in ELSEWHERE:
        raise UserError(f"{path}: {name} is not a task key: {ELSEWHERE[name]}")
    close = difflib.get_close_matches(str(name).replace("-", "_").lower(), list(KEYS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(KEYS)}"
    raise UserError(f"{path}: unknown key {name!r}; {hint}")


@dataclass(frozen=True)
class _Context:
    path: Path
    key: Key

    def wrong(self, value: object, expected: str) -> UserError:
        return UserError(f"{self.path}: {self.key.name}: expected {expected}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true is an int to Python


def _int(value: object, ctx: _Context) -> int:
    if not _is_int(value):
        raise ctx.wrong(value, "a whole number")
    return value


def _number(value: object, ctx: _Context) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        raise ctx.wrong(value, "a number of seconds")
    return float(value)


def _bool(value: object, ctx: _Context) -> bool:
    if isinstance(value, bool):
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    raise ctx.wrong(value, "true or false")


def _text(value: object, ctx: _Context) -> str:
    if not isinstance(value, str):
        raise ctx.wrong(value, "a string")
    return value


def _nproc(value: object, ctx: _Context) -> int | str:
    if _is_int(value) or value == "auto":
        return value
    raise ctx.wrong(value, "a number of processes per node or auto")


def _elastic(value: object, ctx: _Context) -> str:
    if not isinstance(value, str):  # YAML 1.1 reads 1:3 as a base-60 number
        raise ctx.wrong(value, 'MIN:MAX in quotes, e.g. elastic: "1:3" (unquoted, YAML reads 1:3 as a number)')
    return value


def _scalar(value: object) -> bool:
    return isinstance(value, (str, float)) or _is_int(value)


def _args(value: object, ctx: _Context) -> tuple[str, ...]:
    if isinstance(value, list) and all(_scalar(item) for item in value):
        return tuple(str(item) for item in value)
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as err:
            raise UserError(f"{ctx.path}: args {value!r} cannot be split like a shell line ({err}); "
                            f"check its quotes or give a list") from None
    raise ctx.wrong(value, "a list of arguments or one string")


def _env(value: object, ctx: _Context) -> str:
    """A list of NAME / NAME=value, or a mapping NAME: value (empty: from your environment) -> ENV's text."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return shlex.join(value)
    if isinstance(value, dict) and all(isinstance(k, str) and (v is None or _scalar(v)) for k, v in value.items()):
        return shlex.join(k if v is None else f"{k}={v}" for k, v in value.items())
    # No value in the message: env may hold secrets.
    raise UserError(f"{ctx.path}: env: expected a list of NAME or NAME=value, or a mapping NAME: value")


def _script(value: object, ctx: _Context) -> str:
    text = _text(value, ctx)
    if text.lstrip().startswith("-m") or Path(text).expanduser().is_absolute():
        return text
    return str(ctx.path.parent / text)


def _path(value: object, ctx: _Context) -> str:
    return str((ctx.path.parent / Path(_text(value, ctx)).expanduser()).resolve())


PARSE: dict[str, Callable[[Any, _Context], Any]] = {
    "int": _int, "number": _number, "bool": _bool, "text": _text, "nproc": _nproc, "elastic": _elastic,
    "args": _args, "env": _env, "script": _script, "path": _path,
}
