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

* The keys are :data:`KEYS`: the settings of :class:`multinode.core.config.LaunchSpec` declared as task keys
  (:mod:`multinode.core.settings`; not the cluster, the run id or the dry run), each typed by its kind's parser.
  An unknown key, a value of the wrong type or a file that is not YAML is one :class:`UserError` line naming the
  file and the key (a close match is suggested).
* Paths (``workdir``, a ``script`` path) are relative to the file's directory; ``workdir`` defaults to that
  directory when the file names a script.
* A value written in the file's ``env:`` under a name that looks like a secret (``TOKEN``, ``KEY``, ``SECRET``,
  ``PASSWORD``..., :func:`multinode.core.envvars.looks_secret`) is kept, with one warning line in
  :attr:`TaskFile.warnings` (the command line prints it): the file is part of the project, synced with it to
  every node's disk and committed with it; the fix is the name alone (``env: [HF_TOKEN]``), its value taken from
  the caller's environment.
* The values come back typed as LaunchSpec wants them (``args`` a tuple, ``env`` the text of ``ENV``); the
  values' own checks (a mode that does not exist, ``nodes: 0``) stay in LaunchSpec, validated once.
  Which source wins (flag > make variable > task file > default) is :mod:`multinode.core.sources`.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from multinode.core.envvars import looks_secret
from multinode.core.errors import UserError
from multinode.core.setting import Refused, Setting
from multinode.core.settings import TASK_KEYS

TASK_FILE = "multinode.yaml"


KEYS = TASK_KEYS  # name -> its Setting, in LaunchSpec's order
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
    warnings: tuple[str, ...] = ()  # one line each, for the user (a secret written inline in env:)

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
        try:
            values[key.name] = key.kind.value(value, path.parent)
        except Refused as err:
            raise _wrong(path, key, value, err) from None
    implied = frozenset({"workdir"}) if "script" in values and "workdir" not in values else frozenset()
    if implied:
        values["workdir"] = str(path.parent)
    return TaskFile(path, values, implied, inline_secrets(path, values.get("env")))


def inline_secrets(path: Path, env: str | None) -> tuple[str, ...]:
    """One warning line when ``env`` (the task file's, as ENV text) gives a value inline to a secret-looking name."""
    names = [item.partition("=")[0] for item in shlex.split(env or "") if "=" in item]
    secret = [name for name in names if looks_secret(name)]
    if not secret:
        return ()
    listed = ", ".join(secret)
    return (f"warning: {path}: env writes the value of {listed} into the file, which goes where the file goes: with "
            f"your project to every node's disk, and into git; write env: [{listed}] and set "
            f"{'them' if len(secret) > 1 else 'it'} in your environment instead",)


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


def _key(path: Path, name: object) -> Setting:
    if isinstance(name, str) and name in KEYS:
        return KEYS[name]
    if isinstance(name, str) and name in ELSEWHERE:
        raise UserError(f"{path}: {name} is not a task key: {ELSEWHERE[name]}")
    close = difflib.get_close_matches(str(name).replace("-", "_").lower(), list(KEYS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(KEYS)}"
    raise UserError(f"{path}: unknown key {name!r}; {hint}")


def _wrong(path: Path, key: Setting, value: object, err: Refused) -> UserError:
    if err.expected is None:
        return UserError(f"{path}: {key.name} {value!r} {err.message}")
    got = f", got {value!r}" if err.shown else ""  # never ENV's value: it may hold secrets
    return UserError(f"{path}: {key.name}: expected {err.expected}{got}")
