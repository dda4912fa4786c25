"""The program typed torchrun's way (``train [options] script.py [args]``, ``train [options] -m pkg.mod [args]``)
reaches the LaunchSpec as the --script/--args flags would; giving it both ways is one line, exit 2; --help is
written for users (issue 36)."""

from __future__ import annotations

import pytest

from multinode import cli


def spec_of(argv: list[str]):
    return cli._launch_spec(cli.parse(["train", *argv]))


@pytest.fixture(autouse=True)
def no_make_variables(monkeypatch):
    for name in ("SCRIPT", "ARGS", "NODES", "WORKDIR", "TASK"):
        monkeypatch.delenv(f"MULTINODE_{name}", raising=False)


def test_a_script_after_the_options_takes_every_word_after_it():
    spec = spec_of(["--run-id", "r1", "--nodes", "3", "train.py", "--nodes", "5", "--lr", "0.1"])
    assert (spec.nodes, spec.script, spec.args) == (3, "train.py", ("--nodes", "5", "--lr", "0.1"))
    assert spec == spec_of(["--run-id", "r1", "--nodes", "3", "--script", "train.py", "--args", "--nodes 5 --lr 0.1"])


def test_the_same_spec_as_the_flags():
    by_position = spec_of(["--run-id", "r1", "train.py", "a b", "c"])
    by_flags = spec_of(["--run-id", "r1", "--script", "train.py", "--args", "'a b' c"])
    assert by_position == by_flags and by_position.args == ("a b", "c")


def test_a_module_with_its_arguments():
    spec = spec_of(["--run-id", "r1", "-m", "pkg.train", "--epochs", "3"])
    assert (spec.module, spec.entry_args) == ("pkg.train", ("--epochs", "3"))
    assert spec == spec_of(["--run-id", "r1", "--script", "-m pkg.train", "--args", "--epochs 3"])


def test_a_script_without_arguments_gets_none_not_the_trainers_defaults(monkeypatch):
    monkeypatch.setenv("MULTINODE_ARGS", "--from-make 1")
    assert spec_of(["train.py"]).args == ()
    assert spec_of(["--args", "--x 1", "train.py"]).args == ("--x", "1")


def test_no_program_is_the_bundled_trainer():
    spec = spec_of([])
    assert spec.script is None and spec.args == ("--workload", "digits", "10", "5")


@pytest.mark.parametrize("argv, message", [
    (["--script", "a.py", "b.py"], "the program is given twice: --script a.py and b.py; drop --script or the program"),
    (["--args=--x 1", "b.py", "--y"], "the arguments are given twice: --args '--x 1' and after b.py; give them after"),
    (["-m"], "-m needs a module after it: multinode train -m pkg.train"),
    (["-m", "not a module"], "must look like '-m package.module [args]'"),
])
def test_given_both_ways_is_one_line_exit_2_and_nothing_written(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path))
    assert cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_help_is_written_for_users(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "parsing only" not in text and ":mod:" not in text
    assert "multinode train train.py --epochs 3" in text and ".multinode/<cluster>/" in text
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    assert "usage: multinode train [options] [script.py [args] | -m pkg.mod [args]]" in text
    assert "bundled trainer" in text


def test_m_after_the_program_is_the_programs_and_m_elsewhere_is_refused(capsys):
    assert spec_of(["train.py", "-m", "x"]).args == ("-m", "x")
    assert spec_of(["--script", "-m pkg.train"]).module == "pkg.train"  # the flag's value, not -m
    with pytest.raises(SystemExit) as stop:
        cli.parse(["status", "-m"])
    assert stop.value.code == 2 and "unrecognized arguments: -m" in capsys.readouterr().err


def test_folding_the_program_twice_changes_nothing():
    args = cli.parse(["train", "--run-id", "r1", "-m", "pkg.train", "--epochs", "3"])
    first = cli._launch_spec(args)
    assert cli._launch_spec(args) == first and first.module == "pkg.train"
