"""Every setting the CLI reads, declared once, and what is derived from the declarations.

The declarations are the fields of :class:`LaunchSpec` (``train``) and :class:`ClusterSpec` (``up``) made with
:func:`multinode.core.setting.setting`, and, below, the few settings that belong to a command rather than to a
spec (CLUSTER, TASK, SCHEDULER, YES, the AWS ones, NODE, IN, NOTICE). From them, and from nowhere else:

* each verb's flags (:func:`add_flags`): ``--<name-with-dashes>``, a switch takes no value; every flag defaults to
  None, so that :mod:`multinode.core.sources` knows what was typed and settles flag > environment > task file >
  default;
* the task file's keys (:data:`TASK_KEYS`, :mod:`multinode.core.taskfile`);
* the settings tables of ``docs/configuration.md`` (:func:`markdown`), between its ``<!-- settings:NAME -->``
  and ``<!-- /settings:NAME -->`` lines;
* ``scripts/settings.mk``, which the Makefile includes (:func:`makefile_include`): ``export MULTINODE_<VARIABLE>`` for
  each setting that ``make`` passes on, and the list ``make help`` shows.

``python -m multinode.core.settings --write`` rewrites both files (``--markdown``, ``--make`` print them); a unit
test fails when a committed one differs. Adding a setting is one declaration (a spec field, or a
:func:`command` here) plus its use, then ``--write``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from multinode.core.config import DEFAULT_CLUSTER, ClusterSpec, LaunchSpec
from multinode.core.setting import COMMAND_LINE, SECONDS, SWITCH, TEXT, WHOLE, Kind, Setting

REPO = Path(__file__).resolve().parents[3]
DOCS, INCLUDE = Path("docs/configuration.md"), Path("scripts/settings.mk")


def _named(declared: Setting, name: str, default: Any) -> Setting:
    variable = name.upper() if declared.variable == "" else declared.variable
    return replace(declared, name=name, default=default, variable=variable)


def _on_fields(spec: type) -> tuple[Setting, ...]:
    """The settings declared on a spec's fields, in the fields' order, each with the field's default."""
    return tuple(_named(f.metadata["setting"], f.name, None if f.default is MISSING else f.default)
                 for f in fields(spec) if "setting" in f.metadata)


def command(name: str, default: Any, kind: Kind, help: str, **declared: Any) -> Setting:
    """A setting of a command, not of a spec (see :class:`Setting` for ``declared``)."""
    return _named(Setting(kind, help, **declared), name, default)


CLUSTER = command("cluster", DEFAULT_CLUSTER, TEXT, "the cluster's name; its state lives in .multinode/CLUSTER/")
SCHEDULER = command("scheduler", None, TEXT, "local provider: slurm, an embedded SLURM cluster on the nodes",
                    see="[slurm.md](slurm.md)")
YES = command("yes", False, SWITCH, "up: do not ask before creating billable resources; down: also delete an ECR "
              "repository holding images; reap: delete what it finds")
# PROVIDER=aws (multinode.providers.aws.settings reads them; -o key=value gives them as flags).
AWS = (
    command("region", None, TEXT, "AWS: the region (required)", flag=False),
    command("ssh_cidr", None, TEXT, "AWS: the addresses SSH is open to (required), e.g. your address as a /32; "
            "0.0.0.0/0 is refused", flag=False),
    command("ttl_hours", 8, WHOLE, "AWS: hours after which the instances end themselves, 1 to 72", flag=False),
    command("spot", False, SWITCH, "AWS: spot instances instead of on-demand", flag=False),
    command("owner", None, TEXT, "AWS: the owner tag (unset: your user name)", flag=False),
    command("instance_type", None, TEXT, "AWS: overrides the type CLUSTER_TYPE picks", flag=False),
    command("buckets", None, TEXT, "AWS: S3 buckets the nodes may use (DATA, CHECKPOINT_URL), space-separated names; "
            "their role gets list, read, write and delete there, nothing elsewhere (unset: no S3 access)", flag=False,
            see="[checkpoints.md](checkpoints.md)"),
    command("image_ref", None, TEXT, "AWS: the image the nodes pull and run jobs in; it must name a registry (unset: "
            "the host runtime, torch, Open MPI and mpi4py in /opt/multinode/venv, installed at boot)", flag=False,
            env="IMAGE", see="[aws.md](aws.md#images)"),
)
TASK = command("task", None, TEXT, "a task file, or a directory holding multinode.yaml (unset: WORKDIR/multinode.yaml "
               "if there is one)", metavar="PATH", see="[Task file](#task-file-multinodeyaml)")
NODE = command("node", None, TEXT, "which node, by index or name: make preempt's (unset: 1), make ssh's (unset: 0), "
               "make logs' (unset: every node)")
IN = command("in", 0, SECONDS, "make preempt: seconds from now until the notice shows")
NOTICE = command("notice", "interruption", TEXT, "make preempt: interruption (spot/instance-action: the job stops) or "
                 "rebalance (events/recommendations/rebalance only: one checkpoint, the job goes on)")

REPLACE_DELAY = command("replace_delay", 0.0, SECONDS, "drills on the local provider: the seconds every replacement "
                        "takes on top of making the node (an EC2 instance's launch and bootstrap); the orchestrator's "
                        "environment only", flag=False, make=None, see="[recovery.md](recovery.md)")
RUN = command("run", None, TEXT, "make logs, report, stacks: which run, by its id (unset: the latest; stacks: every "
              "run with live ranks)")

UP = (*_on_fields(ClusterSpec), SCHEDULER, YES)
TRAIN = (TASK, *_on_fields(LaunchSpec))
TASK_KEYS: dict[str, Setting] = {s.name: s for s in TRAIN if s.task}
EVERY = (CLUSTER, *UP, *AWS, *TRAIN, NODE, IN, NOTICE, RUN, REPLACE_DELAY)



def find(group: Iterable[Setting], name: str) -> Setting:
    """The setting ``name`` of a group (UP, TRAIN...)."""
    return next(s for s in group if s.name == name)


# The tables of docs/configuration.md, by name.
SECTIONS: dict[str, tuple[Setting, ...]] = {
    "cluster": (CLUSTER, *(find(UP, name) for name in ("provider", "nodes", "mtu")), SCHEDULER, YES),
    "aws": (find(UP, "cluster_type"), *AWS),
    "train": TRAIN,
    "verbs": (NODE, IN, NOTICE, RUN, REPLACE_DELAY),
}


def add_flags(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """One flag per setting that has one; each defaults to None (not given), a switch's is ``"1"`` when given."""
    for s in settings:
        if not s.flag:
            continue
        text = s.help + (f" (default {shown_default(s)})" if _has_default(s) else "")
        text = text.replace("%", "%%")  # argparse formats help with %
        if s.kind is SWITCH:
            parser.add_argument(s.option, dest=s.name, action="store_const", const="1", default=None, help=text)
        else:
            parser.add_argument(s.option, dest=s.name, default=None, metavar=s.metavar, help=text)


def _has_default(s: Setting) -> bool:
    return s.default is not None and s.default is not False and s.default != ()


def shown_default(s: Setting) -> str:
    """The default as a user would type it."""
    if s.default is None or s.default == ():
        return "unset"
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    if isinstance(s.default, tuple):
        return " ".join(s.default)
    if isinstance(s.default, float):
        return f"{s.default:g}"
    return str(s.default)


def make_exports() -> dict[str, str]:
    """``MULTINODE_<NAME>`` -> how make sets it, for every setting that ``make`` passes on."""
    exports = {}
    for s in EVERY:
        if s.variable and s.make:
            given = f"$(if $(filter command line,$(origin {s.variable})),$({s.variable}))" if s.make == COMMAND_LINE \
                else f"$(call given,{s.variable})"
            exports[s.environ] = given
    return exports


def makefile_include() -> str:
    """scripts/settings.mk: the exports, and SETTINGS (the variables, for ``make help``)."""
    variables = " ".join(dict.fromkeys(s.variable for s in EVERY if s.variable and s.make))
    lines = [f"# {line}" for line in MAKE_HEADER.splitlines()]
    lines += [f"export {name} := {value}" for name, value in make_exports().items()]
    return "\n".join([*lines, f"SETTINGS := {variables}", ""])


MAKE_HEADER = """\
Generated from scripts/multinode/core/settings.py by `python -m multinode.core.settings --write`; do not edit.
Each setting make passes to the CLI as MULTINODE_<NAME>, only when given (on make's command line or in the
environment): the Makefile's own defaults (NODES ?= 2) never hide a task file's value. `given` is the Makefile's."""


def _row(s: Setting) -> str:
    variable = f"`{s.variable}`" if s.make else f"`{s.environ}` only"
    flag = f"`{s.option}`" if s.flag else "-"
    key = f"`{s.name}`" if s.task else "-"
    default = f"`{shown_default(s)}`" if shown_default(s) != "unset" else "unset"
    see = f"; see {s.see}" if s.see else ""
    return f"| {variable} | {flag} | {key} | {default} | {s.help}{see} |"


def markdown(section: str) -> str:
    """One table of docs/configuration.md: variable, flag, task key, default, meaning."""
    lines = ["| variable | flag | task key | default | meaning |", "|---|---|---|---|---|"]
    return "\n".join(lines + [_row(s) for s in SECTIONS[section]]) + "\n"


def with_tables(text: str) -> str:
    """``text`` (docs/configuration.md) with each ``<!-- settings:NAME -->`` block holding the table NAME."""
    out, rest = [], text
    for name in SECTIONS:
        begin, end = f"<!-- settings:{name} -->\n", f"<!-- /settings:{name} -->\n"
        head, found, tail = rest.partition(begin)
        if not found or end not in tail:
            raise ValueError(f"no '{begin.strip()}' ... '{end.strip()}' block (in this order)")
        out += [head, begin, markdown(name), end]
        rest = tail.partition(end)[2]
    return "".join(out) + rest


def generated(root: Path) -> dict[Path, str]:
    """The files derived from the declarations, under the repository ``root``, as they should read."""
    docs = root / DOCS
    return {docs: with_tables(docs.read_text()), root / INCLUDE: makefile_include()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multinode.core.settings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help=f"print the settings tables of {DOCS}")
    parser.add_argument("--make", action="store_true", help=f"print {INCLUDE}")
    parser.add_argument("--write", metavar="ROOT", nargs="?", const=REPO, type=Path,
                        help=f"rewrite {DOCS}'s tables and {INCLUDE} in the repository ROOT (default: this one)")
    args = parser.parse_args(argv)
    if args.write:
        try:
            for path, text in generated(args.write).items():
                path.write_text(text)
        except (OSError, ValueError) as err:
            print(f"{args.write}: {err}", file=sys.stderr)
            return 2
    if args.markdown:
        print("".join(f"<!-- settings:{name} -->\n{markdown(name)}" for name in SECTIONS), end="")
    if args.make:
        print(makefile_include(), end="")
    if not (args.write or args.markdown or args.make):
        parser.print_usage(sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
