"""The task file (multinode.core.taskfile) and the settings' sources (multinode.core.sources): keys, types,
paths relative to the file, one-line errors naming the file and the key, flag > make variable > task file >
default, and where each value came from. Files in tmp_path; no sockets, no subprocesses."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from multinode import cli
from multinode.core.config import DEFAULT_TRAIN_ARGS, LaunchSpec
from multinode.core.errors import UserError
from multinode.core.sources import DEFAULT, FLAG, TASK, VARIABLE, settle
from multinode.core.taskfile import KEYS, find_task, load_task


def task(tmp_path: Path, text: str, name: str = "multinode.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(path: Path) -> str:
    with pytest.raises(UserError) as err:
        load_task(path)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_every_setting_of_a_task_is_a_key_with_its_make_variable():
    per_run = {"run_id", "dry_run", "queue"}  # given per command, not part of a task
    internal = {"preflight_timeout"}  # no flag or variable either: set by the tests and benchmarks
    assert set(KEYS) == {f.name for f in fields(LaunchSpec)} - per_run - internal
    assert all(key.variable == key.name.upper() for key in KEYS.values())


def test_values_are_typed_for_launchspec_and_paths_are_relative_to_the_file(tmp_path):
    path = task(tmp_path, "nodes: 3\nnproc: auto\nscript: src/train.py\nargs: [--epochs, 5, 0.5]\n"
                          "env: [HF_TOKEN, EPOCHS=5]\nstall_timeout: 60\nelastic: '2:3'\nsetup: pip install -r r.txt\n")
    values = load_task(path).values
    assert values == {"nodes": 3, "nproc": "auto", "script": str(tmp_path / "src/train.py"),
                      "args": ("--epochs", "5", "0.5"), "env": "HF_TOKEN EPOCHS=5", "stall_timeout": 60.0,
                      "elastic": "2:3", "setup": "pip install -r r.txt", "workdir": str(tmp_path)}
    assert load_task(path).implied == {"workdir"}
    other = load_task(task(tmp_path, "workdir: ../proj\nscript: -m pkg.train --lr 1\nargs: --a 'b c'\n"
                                     "env: {HF_TOKEN: , EPOCHS: 5}\n", "other.yaml")).values
    assert other == {"workdir": str(tmp_path.parent / "proj"), "script": "-m pkg.train --lr 1", "args": ("--a", "b c"),
                     "env": "HF_TOKEN EPOCHS=5"}
    assert load_task(task(tmp_path, "", "empty.yaml")).values == {}


@pytest.mark.parametrize("text, message", [
    ("stall-timeout: 5\n", "unknown key 'stall-timeout'; did you mean 'stall_timeout'?"),
    ("NODES: 2\n", "unknown key 'NODES'; did you mean 'nodes'?"),
    ("zzz: 1\n", "unknown key 'zzz'; valid keys: nodes, mode, nproc,"),
    ("cluster: dev\n", "cluster is not a task key: the cluster is chosen per command: CLUSTER=name"),
    ("nodes: two\n", "nodes: expected a whole number, got 'two'"),
    ("nodes: true\n", "nodes: expected a whole number, got True"),
    ("nproc: many\n", "nproc: expected a number of processes per node or auto, got 'many'"),
    ("stall_timeout: soon\n", "stall_timeout: expected a number of seconds, got 'soon'"),
    ("mode: [cpu]\n", "mode: expected a string, got ['cpu']"),
    ("elastic: 1:3\n", 'elastic: expected MIN:MAX in quotes, e.g. elastic: "1:3"'),
    ("args: {a: 1}\n", "args: expected a list of arguments or one string"),
    ("args: \"--x 'open\"\n", "args \"--x 'open\" cannot be split like a shell line"),
    ("setup:\n", "setup has no value; give one or remove the line"),
    ("- nodes: 2\n", "must hold keys and values (nodes: 2, script: train.py ...), not a list"),
    ("nodes: [2\n", "is not valid YAML at line 2, column 1"),
    ("nodes: 2\nmode: cpu\nnodes: 3\n", "'nodes' (line 3) is given twice; keep one"),
    ("[nodes]: 2\n", "is not valid YAML at line 1, column 1: found unhashable key"),
    ("mode: !!python/name:os.system\n", "is not valid YAML at line 1, column 7"),
])
def test_a_bad_task_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = task(tmp_path, text)
    error = one_line_error(path)
    assert error.startswith(str(path)) and message in error, error


def test_a_file_that_is_not_text_is_one_line(tmp_path):
    path = tmp_path / "multinode.yaml"
    path.write_bytes(b"nodes: \xff\xfe\n")
    assert one_line_error(path) == f"{path} is not UTF-8 text; a task file is YAML (key: value per line)"


def test_env_errors_never_show_a_value(tmp_path):
    error = one_line_error(task(tmp_path, "env: {HF_TOKEN: {nested: hf_secret}}\n"))
    assert "env: expected a list of NAME or NAME=value" in error and "hf_secret" not in error


def test_the_task_file_is_task_or_workdirs_multinode_yaml(tmp_path):
    task(tmp_path, "nodes: 3\n")
    assert find_task(None, None) is None and find_task(None, str(tmp_path / "nowhere")) is None
    assert find_task(None, str(tmp_path)).values == {"nodes": 3}
    assert find_task(str(tmp_path), None).path == tmp_path / "multinode.yaml"  # a directory: its multinode.yaml
    other = task(tmp_path, "nodes: 4\n", "other.yaml")
    assert find_task(str(other), str(tmp_path)).values == {"nodes": 4}  # TASK wins over WORKDIR's
    with pytest.raises(UserError, match=r"^TASK=/no/such.yaml: no such file; give the path of a task file"):
        find_task("/no/such.yaml", None)


def test_a_flag_wins_over_a_variable_which_wins_over_the_task_file_which_wins_over_the_default(tmp_path):
    path = task(tmp_path, "nodes: 3\nmode: mpi\nnproc: 2\nscript: train.py\n")
    environ = {"MULTINODE_MODE": "cpu", "MULTINODE_NPROC": "4", "MULTINODE_SKEW": ""}  # empty: not given
    settled = settle({"nproc": "1"}, environ, load_task(path))
    assert settled.values == {"nodes": 3, "mode": "cpu", "nproc": 1, "script": str(tmp_path / "train.py"),
                              "workdir": str(tmp_path)}
    assert settled.origins == {"nodes": TASK, "mode": VARIABLE, "nproc": FLAG, "script": TASK, "workdir": TASK}
    spec = settled.spec({}, run_id="r1")
    assert (spec.nodes, spec.mode, spec.nproc, spec.skew, spec.args) == (3, "cpu", 1, "refuse", ())
    assert settled.origins.get("skew", DEFAULT) == DEFAULT
    assert settle({}, {}, None).spec({}, run_id="r").args == DEFAULT_TRAIN_ARGS


def test_a_value_error_from_the_task_file_names_the_file_and_the_key(tmp_path):
    path = task(tmp_path, "nodes: 2\nelastic: '1:3'\n")
    with pytest.raises(UserError) as err:
        settle({}, {}, load_task(path)).spec({}, run_id="r")
    assert str(err.value) == f"{path}: nodes, elastic: ELASTIC='1:3': MAX must equal NODES=2"
    with pytest.raises(UserError) as err:  # the same value from a variable: the variable's own message
        settle({}, {"MULTINODE_MODE": "tpu"}, load_task(path)).spec({}, run_id="r")
    assert str(err.value) == "unknown MODE 'tpu'; valid modes: cpu, gpu, mpi, mpi-gpu"


@pytest.mark.parametrize("environ, message", [
    ({"MULTINODE_NODES": "three"}, "NODES='three' must be a whole number"),
    ({"MULTINODE_NPROC": "x"}, "NPROC='x' must be a number or auto (one process per GPU, 1 on CPU nodes)"),
    ({"MULTINODE_STALL_TIMEOUT": "soon"}, "STALL_TIMEOUT='soon' must be a number of seconds"),
])
def test_variables_and_flags_are_typed_with_one_line_errors(environ, message):
    with pytest.raises(UserError) as err:
        settle({}, environ, None)
    assert str(err.value) == message
    with pytest.raises(UserError, match="^RDZV_PORT='x' must be a whole number$"):  # a flag: named the same way
        settle({"rdzv_port": "x"}, {}, None)


def test_the_settings_block_names_each_source_and_never_a_secret_value(tmp_path):
    path = task(tmp_path, "nodes: 3\nscript: train.py\nenv: {HF_TOKEN: hf_inline_secret}\nsetup: |\n  a\n  b\n")
    settled = settle({"nproc": "2"}, {"MULTINODE_STALL_TIMEOUT": "30"}, load_task(path))
    text = settled.describe(settled.spec({}, run_id="r"))
    lines = text.splitlines()
    assert lines[0] == f"settings (flag > make variable > task file {path} > default):"
    assert len(lines) == 1 + len(KEYS) and "hf_inline_secret" not in text
    assert "  nodes             3                        [task file]" in lines
    assert "  nproc             2                        [flag --nproc]" in lines
    assert "  stall_timeout     30                       [make variable STALL_TIMEOUT (MULTINODE_STALL_TIMEOUT)]" in lines
    assert "  env               HF_TOKEN=***             [task file]" in lines
    assert "  setup             a\\nb                     [task file]" in lines
    assert f"  workdir           {tmp_path}" in text and "[task file (its directory, as it names a script)]" in text
    assert "  mode              cpu                      [default]" in lines


def test_cli_bad_task_key_is_one_line_exit_2_nothing_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path / "home"))
    path = task(tmp_path, "nodes: 2\nnum_nodes: 3\n")
    assert cli.main(["train", "--task", str(path)]) == 2
    assert capsys.readouterr().err == f"multinode: {path}: unknown key 'num_nodes'; did you mean 'nodes'?\n"
    assert not (tmp_path / "home").exists()


def test_the_task_files_in_the_docs_are_valid(tmp_path):
    import re

    repo = Path(__file__).resolve().parents[2]
    blocks = [block for doc in ("docs/configuration.md", "docs/projects.md")
              for block in re.findall(r"```yaml\n(.*?)```", (repo / doc).read_text(), re.S)]
    assert len(blocks) == 2
    for i, block in enumerate(blocks):
        spec = settle({}, {}, load_task(task(tmp_path, block, f"doc{i}.yaml"))).spec({"HF_TOKEN": "x"}, run_id="r")
        assert spec.nodes == 3 and spec.module == "pkg.train" and spec.workdir == str(tmp_path)


def test_a_plan_error_caused_by_the_task_file_names_it(tmp_path, monkeypatch, capsys):
    from dataclasses import replace

    from conftest import make_inventory

    home = tmp_path / "home"
    (home / "dev").mkdir(parents=True)
    for name in ("id_ed25519", "known_hosts"):
        (home / "dev" / name).write_text("")
    replace(make_inventory(2), ssh_key=str(home / "dev" / "id_ed25519"),
            known_hosts=str(home / "dev" / "known_hosts")).save(home / "dev" / "inventory.json")
    monkeypatch.setenv("MULTINODE_HOME", str(home))
    path = task(tmp_path, "nodes: 3\n")
    assert cli.main(["train", "--task", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"multinode: {path}: nodes: NODES=3 but cluster 'dev' has 2 nodes") and err.count("\n") == 1
    assert cli.main(["train", "--task", str(path), "--dry-run", "--nodes", "3"]) == 2  # a flag: its own message
    assert capsys.readouterr().err.startswith("multinode: NODES=3 but cluster 'dev' has 2 nodes")


@pytest.mark.parametrize("env, named", [
    ("env: [HF_TOKEN=hf_secret, EPOCHS=3]\n", "HF_TOKEN"),
    ("env: {WANDB_API_KEY: k1, DB_PASSWORD: p2, LR: '0.1'}\n", "WANDB_API_KEY, DB_PASSWORD"),
    ("env: [AWS_SECRET_ACCESS_KEY=abc, GH_CREDENTIALS=x]\n", "AWS_SECRET_ACCESS_KEY, GH_CREDENTIALS"),
])
def test_a_secret_written_inline_gets_one_warning_line_with_the_fix(tmp_path, env, named):
    path = task(tmp_path, env)
    loaded = load_task(path)
    assert len(loaded.warnings) == 1 and "\n" not in loaded.warnings[0]
    warning = loaded.warnings[0]
    assert warning.startswith(f"warning: {path}: env writes the value of {named} into the file")
    assert "every node's disk" in warning and "git" in warning and f"env: [{named}]" in warning
    assert not any(value in warning for value in ("hf_secret", "k1", "p2", "abc"))  # names only, never a value
    assert "env" in loaded.values  # a warning, not a refusal: the run goes on


@pytest.mark.parametrize("env", ["env: [HF_TOKEN, EPOCHS=3]\n", "env: {HF_TOKEN: null, LR: '0.1'}\n", "nodes: 2\n"])
def test_names_alone_and_inline_values_of_ordinary_names_get_no_warning(tmp_path, env):
    assert load_task(task(tmp_path, env)).warnings == ()


def test_the_command_line_prints_the_warning_once_and_goes_on(tmp_path, monkeypatch, capsys):
    from multinode import cli

    monkeypatch.setenv("MULTINODE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MULTINODE_TASK", raising=False)
    path = task(tmp_path, "env: [HF_TOKEN=hf_secret]\n")
    assert cli.main(["--cluster", "nope", "train", "--task", str(path)]) == 2  # on to the next check: no cluster
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"multinode: warning: {path}: env writes the value of HF_TOKEN") and len(err) == 2
    assert err[1] == "multinode: cluster 'nope' is not up; run 'make up' first" and "hf_secret" not in "".join(err)
