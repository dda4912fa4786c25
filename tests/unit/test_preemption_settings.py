"""GRACE, RESUME, RECOVER, RECOVER_WAIT as settings (docs/preemption.md): LaunchSpec fields validated once with
one-line errors, a flag, a make variable (MULTINODE_<NAME>) and a task-file key each, and the dry run's settings
block naming where each came from. The Makefile is read, not run. No sockets, no subprocesses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multinode import cli
from multinode.core.config import DEFAULT_RECOVER_WAIT, LaunchSpec
from multinode.core.errors import UserError
from multinode.core.setting import SECONDS, SWITCH, WHOLE
from multinode.core.sources import FLAG, TASK, VARIABLE, settle
from multinode.core.taskfile import KEYS, load_task

REPO = Path(__file__).resolve().parents[2]
NAMES = ("grace", "resume", "recover", "recover_wait")


def test_defaults_change_nothing():
    spec = LaunchSpec()
    assert (spec.grace, spec.resume, spec.recover, spec.recover_wait) == (None, False, 0, DEFAULT_RECOVER_WAIT)


@pytest.mark.parametrize("kwargs, message", [
    (dict(grace=0.0), "GRACE=0 must be a positive number of seconds, e.g. GRACE=60"),
    (dict(grace=-5.0), "GRACE=-5 must be a positive number of seconds"),
    (dict(recover=-1), "RECOVER=-1 must be 0 (off) or the number of recoveries allowed, e.g. RECOVER=2"),
    (dict(recover_wait=-1.0), "RECOVER_WAIT=-1 must be 0 or more seconds to wait for a replacement node"),
    (dict(resume="yes"), "RESUME='yes' must be 1 (continue the latest preempted run) or 0"),
])
def test_bad_values_are_one_line_naming_the_value_and_the_fix(kwargs, message):
    with pytest.raises(UserError) as err:
        LaunchSpec(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_each_is_a_task_key_with_its_make_variable():
    assert [(KEYS[n].variable, KEYS[n].kind) for n in NAMES] == [
        ("GRACE", SECONDS), ("RESUME", SWITCH), ("RECOVER", WHOLE), ("RECOVER_WAIT", SECONDS)]


def test_task_file_values_are_typed(tmp_path):
    path = tmp_path / "multinode.yaml"
    path.write_text("grace: 30\nresume: true\nrecover: 2\nrecover_wait: 45.5\n")
    assert load_task(path).values == {"grace": 30.0, "resume": True, "recover": 2, "recover_wait": 45.5}
    path.write_text("resume: maybe\n")
    with pytest.raises(UserError, match=r"resume: expected true or false, got 'maybe'$"):
        load_task(path)


@pytest.mark.parametrize("text, value", [("1", True), ("yes", True), ("0", False), ("false", False)])
def test_resume_variable_forms(text, value):
    assert settle({}, {"MULTINODE_RESUME": text}, None).values == {"resume": value}


@pytest.mark.parametrize("environ, message", [
    ({"MULTINODE_GRACE": "soon"}, "GRACE='soon' must be a number of seconds"),
    ({"MULTINODE_RESUME": "please"}, "RESUME='please' must be 1 or 0 (also yes/no, true/false)"),
    ({"MULTINODE_RECOVER": "two"}, "RECOVER='two' must be a whole number"),
    ({"MULTINODE_RECOVER_WAIT": "x"}, "RECOVER_WAIT='x' must be a number of seconds"),
])
def test_variables_are_typed_with_one_line_errors(environ, message):
    with pytest.raises(UserError) as err:
        settle({}, environ, None)
    assert str(err.value) == message


def test_flags_win_over_variables_over_the_task_file_and_the_dry_run_names_each_source(tmp_path):
    path = tmp_path / "multinode.yaml"
    path.write_text("grace: 90\nrecover: 1\nrecover_wait: 10\n")
    args = cli.build_parser().parse_args(["train", "--grace", "30", "--resume", "--run-id", "r"])
    flags = {name: getattr(args, name) for name in KEYS}
    settled = settle(flags, {"MULTINODE_RECOVER": "3"}, load_task(path))
    assert {n: settled.origins[n] for n in NAMES} == {"grace": FLAG, "resume": FLAG, "recover": VARIABLE,
                                                      "recover_wait": TASK}
    spec = settled.spec({}, run_id="r")
    assert (spec.grace, spec.resume, spec.recover, spec.recover_wait) == (30.0, True, 3, 10.0)
    lines = settled.describe(spec).splitlines()
    assert "  grace             30                       [flag --grace]" in lines
    assert "  resume            yes                      [flag --resume]" in lines
    assert "  recover           3                        [make variable RECOVER (MULTINODE_RECOVER)]" in lines
    assert "  recover_wait      10                       [task file]" in lines


def test_a_bad_grace_from_the_task_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "multinode.yaml"
    path.write_text("grace: 0\n")
    with pytest.raises(UserError) as err:
        settle({}, {}, load_task(path)).spec({}, run_id="r")
    assert str(err.value).startswith(f"{path}: grace: GRACE=0 must be a positive number of seconds")


def test_make_exports_each_only_when_given_and_lists_it_in_help():
    text = (REPO / "scripts" / "settings.mk").read_text()  # generated from the declarations (tests/unit/test_settings.py)
    for name in ("GRACE", "RESUME", "RECOVER", "RECOVER_WAIT"):
        assert f"export MULTINODE_{name} := $(call given,{name})\n" in text  # never a default of make's
        assert re.search(rf"^SETTINGS := .*\b{name}\b", text, re.M), name
        assert not re.search(rf"^{name} \?=", (REPO / "Makefile").read_text(), re.M)
