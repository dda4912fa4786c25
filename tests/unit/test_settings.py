"""Each setting declared once (multinode.core.settings): the flags, the task keys, the docs' tables and the
Makefile's exports follow the declarations; one parser per kind, a switch refusing any word but its own. The
Makefile and the docs are read, not run. No sockets, no subprocesses."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from multinode import cli
from multinode.core import settings
from multinode.core.config import ClusterSpec, LaunchSpec
from multinode.core.errors import UserError
from multinode.core.setting import NPROC, SECONDS, SWITCH, WHOLE, Refused
from multinode.core.sources import typed
from multinode.core.taskfile import KEYS, load_task

REPO = Path(__file__).resolve().parents[2]
EXPORT = re.compile(r"^export (MULTINODE_\w+) := (.*)$", re.M)


def test_every_spec_field_a_user_gives_is_a_declared_setting():
    internal = {"preflight_timeout"}  # set by the tests and the benchmarks, never by a user
    assert {s.name for s in settings.TRAIN} - {"task"} == {f.name for f in fields(LaunchSpec)} - internal
    assert {s.name for s in settings.UP} - {"scheduler", "yes"} == {f.name for f in fields(ClusterSpec)} - {
        "name", "options"}  # name: --cluster, every verb's; options: -o key=value and the AWS variables
    assert all(s.help and s.kind for s in settings.EVERY)


def test_the_task_keys_are_the_settings_declared_as_task_keys():
    assert list(KEYS) == [s.name for s in settings.TRAIN if s.task]
    assert {"run_id", "dry_run", "queue", "task"}.isdisjoint(KEYS)


@pytest.mark.parametrize("verb, declared", [("train", settings.TRAIN), ("up", settings.UP)])
def test_a_verbs_flags_are_its_settings_and_nothing_else(verb, declared):
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[verb]
    flags = {a.option_strings[-1]: a for a in sub._actions if a.option_strings and a.dest != "help"}
    expected = {s.option for s in declared if s.flag}
    assert set(flags) - {"--option"} == expected
    assert all(flags[s.option].default is None for s in declared if s.flag)  # not given: the next source decides
    assert all(flags[s.option].nargs == 0 for s in declared if s.kind is SWITCH)  # --queue, --dry-run take no value


def test_the_docs_tables_are_the_generated_ones():
    text = (REPO / "docs/configuration.md").read_text()
    assert settings.with_tables(text) == text, (
        "docs/configuration.md differs from the declarations: run "
        "'.venv/bin/python -m multinode.core.settings --write docs/configuration.md'")
    for s in settings.EVERY:
        assert f"| `{s.variable}` |" in text or f"| `{s.environ}` only |" in text, s.name


def test_the_generated_files_are_committed_as_generated():
    for path, text in settings.generated(REPO).items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} differs from the declarations: run "
            "'.venv/bin/python -m multinode.core.settings --write'")


def test_the_makefile_exports_every_setting_make_passes_on_through_its_include():
    makefile, include = (REPO / "Makefile").read_text(), (REPO / "scripts" / "settings.mk").read_text()
    assert "\ninclude scripts/settings.mk\n" in makefile and not EXPORT.findall(makefile)  # every export is generated
    assert makefile.index("\ngiven = ") < makefile.index("\ninclude scripts/settings.mk\n")  # settings.mk calls it
    exports = dict(EXPORT.findall(include))
    assert set(exports) == {s.environ for s in settings.EVERY if s.make}
    assert exports["MULTINODE_NODES"] == "$(call given,NODES)"  # never the Makefile's NODES ?= 2
    assert exports["MULTINODE_IMAGE"] == "$(call given,IMAGE_REF)"
    assert exports["MULTINODE_ENV"] == "$(if $(filter command line,$(origin ENV)),$(ENV))"  # not a shell's $ENV
    assert "MULTINODE_RUN_ID" not in exports  # read from the environment only
    assert re.search(r"^\t@echo .*\$\(SETTINGS\)", makefile, re.M)  # make help lists them
    # Switches are read by the CLI, never turned into a flag by make ($(if $(QUEUE),--queue) took QUEUE=0 as on).
    assert not re.search(r"\$\(if \$\((DRY_RUN|QUEUE|YES)\)", makefile)


def test_the_markdown_command_prints_every_table(capsys):
    assert settings.main(["--markdown"]) == 0
    out = capsys.readouterr().out
    assert all(settings.markdown(name) in out for name in settings.SECTIONS)
    assert settings.main(["--make"]) == 0 and capsys.readouterr().out == settings.makefile_include()


def test_write_rewrites_the_generated_files_and_refuses_docs_without_the_blocks(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    docs = tmp_path / "docs" / "configuration.md"
    docs.write_text("intro\n<!-- settings:cluster -->\nold\n<!-- /settings:cluster -->\n")
    assert settings.main(["--write", str(tmp_path)]) == 2
    assert "no '<!-- settings:aws -->'" in capsys.readouterr().err and not (tmp_path / "scripts" / "settings.mk").exists()
    docs.write_text("intro\n" + "".join(f"<!-- settings:{n} -->\n<!-- /settings:{n} -->\n" for n in settings.SECTIONS))
    assert settings.main(["--write", str(tmp_path)]) == 0
    assert settings.markdown("train") in docs.read_text() and docs.read_text().startswith("intro\n")
    assert (tmp_path / "scripts" / "settings.mk").read_text() == settings.makefile_include()


@pytest.mark.parametrize("word, on", [("1", True), ("yes", True), ("true", True), ("TRUE", True), (" Yes ", True),
                                      ("0", False), ("no", False), ("false", False), ("No", False)])
def test_a_switch_takes_its_words(word, on):
    assert SWITCH.text(word) is on
    assert SWITCH.value(word, Path(".")) is on  # the same words in a task file


@pytest.mark.parametrize("word", ["", "2", "on", "off", "y", "enable", "please", "1.0"])
def test_a_switch_refuses_any_other_word_naming_it_and_the_fix(word):
    with pytest.raises(UserError) as err:
        typed(settings.find(settings.TRAIN, "queue"), word)
    assert str(err.value) == f"QUEUE={word!r} must be 1 or 0 (also yes/no, true/false)"


def test_a_task_files_switch_is_yamls_bool_or_1_0(tmp_path):
    path = tmp_path / "multinode.yaml"
    for text, value in (("true", True), ("false", False), ("1", True), ("0", False), ("yes", True)):
        path.write_text(f"resume: {text}\n")
        assert load_task(path).values == {"resume": value}
    path.write_text("resume: 2\n")
    with pytest.raises(UserError, match=r": resume: expected true or false, got 2$"):
        load_task(path)


@pytest.mark.parametrize("kind, text, value", [(WHOLE, "3", 3), (SECONDS, "2.5", 2.5), (NPROC, "auto", "auto"),
                                               (NPROC, "4", 4)])
def test_one_parser_per_kind(kind, text, value):
    assert kind.text(text) == value
    with pytest.raises(Refused):
        kind.text("x")


def _spec(monkeypatch, **environ: str) -> LaunchSpec:
    for name, value in environ.items():
        monkeypatch.setenv(f"MULTINODE_{name}", value)
    return cli._launch_spec(cli.build_parser().parse_args(["train"]))


def test_queue_and_dry_run_are_switches_from_make(monkeypatch):
    assert (_spec(monkeypatch).queue, _spec(monkeypatch).dry_run) == (False, False)
    assert _spec(monkeypatch, QUEUE="yes", DRY_RUN="true").queue is True
    assert _spec(monkeypatch, QUEUE="0", DRY_RUN="no").queue is False  # QUEUE=0 used to queue: make saw a word
    assert _spec(monkeypatch, QUEUE="", DRY_RUN="").queue is False  # make's export of a variable not given
    args = cli.build_parser().parse_args(["train", "--queue", "--dry-run"])
    monkeypatch.setenv("MULTINODE_QUEUE", "0")
    spec = cli._launch_spec(args)
    assert (spec.queue, spec.dry_run) == (True, True)  # a flag wins over the variable


@pytest.mark.parametrize("argv, environ, line", [
    (["train"], {"MULTINODE_QUEUE": "please"}, "QUEUE='please' must be 1 or 0 (also yes/no, true/false)"),
    (["train"], {"MULTINODE_DRY_RUN": "maybe"}, "DRY_RUN='maybe' must be 1 or 0 (also yes/no, true/false)"),
    (["train", "--resume"], {"MULTINODE_QUEUE": "on"}, "QUEUE='on' must be 1 or 0 (also yes/no, true/false)"),
    (["up"], {"MULTINODE_YES": "sure"}, "YES='sure' must be 1 or 0 (also yes/no, true/false)"),
    (["down"], {"MULTINODE_YES": "2"}, "YES='2' must be 1 or 0 (also yes/no, true/false)"),
    (["up", "--nodes", "three"], {}, "NODES='three' must be a whole number"),
    (["up"], {"MULTINODE_MTU": "big"}, "MTU='big' must be a whole number"),
    (["preempt"], {"MULTINODE_IN": "soon"}, "IN='soon' must be a number of seconds"),
    (["netcheck"], {"MULTINODE_NODES": "all"}, "NODES='all' must be a whole number"),
])
def test_a_bad_value_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv, environ, line):
    home = tmp_path / "home"
    monkeypatch.setenv("MULTINODE_HOME", str(home))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"multinode: {line}\n"
    assert not home.exists()
