"""Running the user's project: WORKDIR selection and the incremental sync planner, ENV parsing and masking,
SETUP's inputs, NPROC=auto and -m modules in every launcher's plan. Pure: no sockets, no subprocesses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from multinode.core.sources import typed
from multinode.core.taskfile import KEYS
from multinode.core.config import LaunchSpec
from multinode.core.envvars import EnvVar, env_file_content, parse_env
from multinode.core.errors import UserError
from multinode.plan.launchers.mpirun import RANK_ENV
from multinode.plan.launchers import EntryPoint, get_launcher, launcher_for
from multinode.code.setup import named_files, setup_hash
from multinode.plan.runtime import to_shell
from multinode.code.workdir import FileEntry, Manifest, check_size, filter_paths, plan_sync

from conftest import make_inventory


def manifest(**files: str) -> Manifest:
    """path=sha (dots in paths written as __)."""
    return Manifest({p.replace("__", "."): FileEntry(len(sha), 0o644, sha) for p, sha in files.items()})


# --- the sync planner ------------------------------------------------------------------


def test_a_new_node_gets_every_file():
    local = Manifest({"a.py": FileEntry(3, 0o644, "x"), "pkg/b.py": FileEntry(5, 0o755, "y")})
    plan = plan_sync(local, Manifest({}))
    assert plan.send == ("a.py", "pkg/b.py") and plan.delete == () and plan.send_bytes == 8


def test_an_unchanged_node_gets_nothing_and_one_edit_sends_one_file():
    local = Manifest({"a.py": FileEntry(3, 0o644, "x"), "pkg/b.py": FileEntry(5, 0o644, "y")})
    assert plan_sync(local, local).send == () and plan_sync(local, local).send_bytes == 0
    assert plan_sync(local, local).empty  # no round trip to that node at all
    edited = Manifest({**local.files, "pkg/b.py": FileEntry(5, 0o644, "z")})
    assert plan_sync(edited, local).send == ("pkg/b.py",) and not plan_sync(edited, local).empty
    chmodded = Manifest({**local.files, "a.py": FileEntry(3, 0o755, "x")})
    assert plan_sync(chmodded, local).send == ("a.py",)  # the executable bit travels


def test_deleted_files_are_removed_and_their_emptied_directories_pruned_deepest_first():
    remote = Manifest({"keep.py": FileEntry(1, 0o644, "k"), "old/deep/x.py": FileEntry(1, 0o644, "x"),
                       "pkg/gone.py": FileEntry(1, 0o644, "g"), "pkg/stay.py": FileEntry(1, 0o644, "s")})
    local = Manifest({"keep.py": FileEntry(1, 0o644, "k"), "pkg/stay.py": FileEntry(1, 0o644, "s")})
    plan = plan_sync(local, remote)
    assert plan.send == () and plan.delete == ("old/deep/x.py", "pkg/gone.py") and not plan.empty
    assert plan.prune == ("old/deep", "old")  # pkg/ still holds a file


def test_manifest_round_trip_and_an_unreadable_one_counts_as_empty():
    m = Manifest({"a b.py": FileEntry(3, 0o755, "abc")})
    assert Manifest.from_json(m.to_json()) == m
    for text in ("", "not json", "[1, 2]", json.dumps({"a": [1]})):
        assert Manifest.from_json(text) == Manifest({})


# --- what is sent ----------------------------------------------------------------------


def test_default_excludes_and_multinodeignore_patterns():
    paths = ["train.py", "pkg/__init__.py", "pkg/__pycache__/m.cpython-311.pyc", "x.pyc", ".git/config",
             ".venv/bin/python", "sub/.venv/lib/a.py", "data/big.bin", "notes/data/keep.txt", "wheels/a.whl",
             ".multinode/dev/inventory.json", "logs/run.log", "logs/keep.log"]
    kept = filter_paths(paths, ["# comment", "", "/data/", "*.log", "!keep.log"])
    assert kept == ["logs/keep.log", "notes/data/keep.txt", "pkg/__init__.py", "train.py", "wheels/a.whl"]


def test_a_workdir_over_the_limit_is_refused_naming_its_largest_paths():
    check_size({"a.py": 1000}, 1, "proj")  # under: fine
    sizes = {"a.py": 10, "data/huge.bin": 3 * 2**20, "data/big.bin": 2 * 2**20, "c.txt": 5}
    with pytest.raises(UserError) as err:
        check_size(sizes, 4, "proj")
    line = str(err.value)
    assert "\n" not in line and "WORKDIR=proj" in line and "over the 4 MB limit" in line
    assert line.index("data/huge.bin (3.0 MB)") < line.index("data/big.bin (2.0 MB)")
    assert "WORKDIR_LIMIT_MB" in line and ".multinodeignore" in line


# --- ENV -------------------------------------------------------------------------------


def test_env_takes_names_from_the_caller_and_values_inline():
    env = parse_env("HF_TOKEN EPOCHS=3 'GREETING=hello world' EMPTY=", {"HF_TOKEN": "hf_abc", "OTHER": "x"})
    assert [(v.name, v.value) for v in env] == [("HF_TOKEN", "hf_abc"), ("EPOCHS", "3"),
                                                 ("GREETING", "hello world"), ("EMPTY", "")]
    assert parse_env("", {}) == () and parse_env(None, {}) == ()
    assert "hf_abc" not in repr(env)  # never in a repr, so never in a log line by accident


@pytest.mark.parametrize("text, message", [
    ("MISSING", "ENV names MISSING but MISSING is not set in your environment; export it or give MISSING=value"),
    ("1BAD=x", "ENV entry '1BAD' is not a variable name"),
    ("RANK=3", "ENV names RANK, which the launcher sets on every rank"),
    ("A=1 A=2", "ENV names A twice"),
    ("A='unclosed", "ENV cannot be split like a shell line"),
])
def test_bad_env_is_one_line_without_values(text, message):
    with pytest.raises(UserError) as err:
        parse_env(text, {})
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "unclosed" not in str(err.value) and "=1" not in str(err.value)


def test_env_file_quotes_values_for_sourcing():
    content = env_file_content([EnvVar("A", "it's $HOME; rm -rf /"), EnvVar("B", "x")])
    assert content == "export A='it'\"'\"'s $HOME; rm -rf /'\nexport B=x\n"


SECRET = "hf_SECRETvalue123"


@pytest.mark.parametrize("mode, launcher, runtime", [("cpu", "static", "host"), ("cpu", "torchrun", "host"),
                                                     ("mpi", "auto", "host"), ("cpu", "static", "docker")])
def test_env_values_never_reach_a_plan_a_dry_run_or_a_command_line(mode, launcher, runtime):
    inv = make_inventory(3, runtime=runtime, image="img:1" if runtime == "docker" else None)
    env = (EnvVar("HF_TOKEN", SECRET), EnvVar("EPOCHS", "inline-77"))
    spec = LaunchSpec(mode=mode, nodes=3, run_id="r9", launcher=launcher, script="-m pkg.train", env=env)
    plan = launcher_for(spec).plan(inv, spec, EntryPoint("pkg.train", (), ours=False, module=True, subdir="project"))
    shown = plan.describe() + plan.to_json() + "".join(to_shell(cmd, inv, "r9") for cmd in plan.commands)
    assert SECRET not in shown and "inline-77" not in shown
    assert "HF_TOKEN=***" in plan.describe() and "EPOCHS=***" in plan.describe()
    for cmd in plan.commands:
        assert cmd.env_file == f"/state/dev/nodes/{cmd.node}/runs/r9/env"
        assert f". {cmd.env_file}" in to_shell(cmd, inv, "r9")  # sourced on the node, not passed as arguments
        if runtime == "docker":
            assert "-e HF_TOKEN" in to_shell(cmd, inv, "r9")  # by name into the container
    if mode == "mpi":  # mpirun carries the names to the ranks of every app context
        assert plan.commands[0].argv.count("HF_TOKEN") == 3


# --- SETUP -----------------------------------------------------------------------------


def test_setup_reruns_only_when_the_command_or_the_files_it_names_change():
    files = Manifest({"requirements.txt": FileEntry(10, 0o644, "r1"), "pkg/train.py": FileEntry(5, 0o644, "t1"),
                      "extra/req-dev.txt": FileEntry(3, 0o644, "d1")})
    setup = "pip install -r requirements.txt --requirement=./extra/req-dev.txt && echo done"
    assert named_files(setup, files) == ["requirements.txt", "extra/req-dev.txt"]
    base = setup_hash(setup, files, "/py", None)
    assert setup_hash(setup, replace(files, files={**files.files, "pkg/train.py": FileEntry(6, 0o644, "t2")}),
                      "/py", None) == base  # a file SETUP does not name
    assert setup_hash(setup, replace(files, files={**files.files, "requirements.txt": FileEntry(11, 0o644, "r2")}),
                      "/py", None) != base
    assert setup_hash(setup + " ", files, "/py", None) != base
    assert setup_hash(setup, files, "/py", "image:2") != base
    assert named_files("pip install -rrequirements.txt", files) == ["requirements.txt"]


# --- SCRIPT, -m, NPROC=auto ------------------------------------------------------------


def test_script_module_form_and_its_errors():
    spec = LaunchSpec(script="-m pkg.train --lr 0.1", args=("--epochs", "2"))
    assert spec.module == "pkg.train" and spec.entry_args == ("--lr", "0.1", "--epochs", "2")
    assert LaunchSpec(script="pkg/train.py").module is None
    for bad in ("-m", "-m 3pkg", "-mpkg.train", "-m pkg..train"):
        with pytest.raises(UserError, match="must look like '-m package.module"):
            LaunchSpec(script=bad)
    with pytest.raises(UserError, match="WORKDIR=proj needs SCRIPT"):
        LaunchSpec(workdir="proj")
    with pytest.raises(UserError, match="NPROC='two' must be a number or auto"):
        LaunchSpec(nproc="two")
    with pytest.raises(UserError, match="NPROC='x' must be a number or auto"):
        typed(KEYS["nproc"], "x")
    assert typed(KEYS["nproc"], "auto") == "auto" and typed(KEYS["nproc"], "2") == 2


def test_a_module_runs_with_python_m_in_the_project_directory_under_every_launcher():
    inv = make_inventory(2)
    entry = EntryPoint("pkg.train", ("--lr", "1"), ours=False, module=True, subdir="project")
    for name in ("static", "torchrun", "mpirun"):
        spec = LaunchSpec(mode="mpi" if name == "mpirun" else "cpu", nodes=2, run_id="r1", script="-m pkg.train")
        plan = get_launcher(name).plan(inv, spec, entry)
        argv = list(plan.commands[0].argv)
        i = argv.index("pkg.train")
        assert argv[i - 1] == "-m" and argv[i + 1:i + 3] == ["--lr", "1"], (name, argv)
        assert plan.commands[0].cwd == "/state/dev/nodes/node-0/code/project"
        if name == "mpirun":  # each node's ranks import from their own node's copy
            i = argv.index("/state/dev/nodes/node-1/code/project", argv.index("/state/dev/nodes/node-1/code/project") + 1)
            assert argv[i - 3:i + 3] == ["sh", "-c", RANK_ENV, "/state/dev/nodes/node-1/code/project",
                                         "10.200.7.0/24", "/repo/.venv/bin/python"]
            assert 'export PYTHONPATH="$0${PYTHONPATH:+:$PYTHONPATH}"' in RANK_ENV
        else:
            assert all(cmd.node_env["PYTHONPATH"] == f"/state/dev/nodes/{cmd.node}/code/project${{PYTHONPATH:+:$PYTHONPATH}}"
                       and "PYTHONPATH" not in cmd.env for cmd in plan.commands)


def test_setup_makes_the_ranks_use_their_nodes_own_environment():
    inv = make_inventory(2)
    spec = LaunchSpec(nodes=2, run_id="r1", script="x.py", setup="pip install -r requirements.txt")
    plan = get_launcher("torchrun").plan(inv, spec, EntryPoint("x.py", (), ours=False, subdir="project"))
    assert [cmd.argv[0] for cmd in plan.commands] == [f"/state/dev/nodes/node-{i}/env/bin/python" for i in range(2)]


def gpu_inventory(counts: list[int]):
    inv = make_inventory(len(counts), accelerator="nvidia")
    return replace(inv, nodes=tuple(replace(n, accelerator_count=c) for n, c in zip(inv.nodes, counts)))


def test_nproc_auto_is_one_per_gpu_and_one_on_cpu_nodes():
    entry = EntryPoint("training/train.py")
    gpus = gpu_inventory([4, 2])
    torchrun = get_launcher("torchrun").plan(gpus, LaunchSpec(mode="gpu", nodes=2, nproc="auto", run_id="r"), entry)
    assert [a for cmd in torchrun.commands for a in cmd.argv if a.startswith("--nproc-per-node")] == \
        ["--nproc-per-node=4", "--nproc-per-node=2"]
    assert torchrun.world_size == 6 and "processes per node: node-0=4, node-1=2" in torchrun.describe()
    static = get_launcher("static").plan(gpus, LaunchSpec(mode="gpu", nodes=2, nproc="auto", run_id="r"), entry)
    assert [cmd.argv[4:6] for cmd in static.commands] == [("0", "4"), ("4", "2")]  # first rank, count
    assert [cmd.env["WORLD_SIZE"] for cmd in static.commands] == ["6", "6"]
    mpi = get_launcher("mpirun").plan(gpus, LaunchSpec(mode="mpi-gpu", nodes=2, nproc="auto", run_id="r"), entry)
    argv = list(mpi.commands[0].argv)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-np"] == ["4", "2"] and mpi.world_size == 6
    assert mpi.commands[0].files["/state/dev/nodes/node-0/runs/r/hostfile"] == "10.200.7.10 slots=4\n10.200.7.11 slots=2\n"
    relabel = get_launcher("mpirun").relabel(mpi)
    assert relabel("node-0", "[1,4]<stdout>: hi") == [("node-1", "[rank4]:  hi")]
    cpu = get_launcher("static").plan(make_inventory(3), LaunchSpec(nodes=3, nproc="auto", run_id="r"), entry)
    assert cpu.world_size == 3 and cpu.procs == (1, 1, 1)


def test_setup_runs_in_the_jobs_runtime_in_the_project_directory():
    files = Manifest({"requirements.txt": FileEntry(10, 0o644, "r1")})
    spec = LaunchSpec(nodes=2, run_id="r3", script="x.py", setup="pip install -r requirements.txt",
                      env=(EnvVar("HF_TOKEN", SECRET),))
    from multinode.code.setup import plan_setup

    for runtime in ("host", "docker"):
        inv = make_inventory(2, runtime=runtime, image="img:1" if runtime == "docker" else None)
        commands = plan_setup(inv, spec, files, lambda node: f"/state/dev/nodes/{node}/code/project")
        line = to_shell(commands["node-1"], inv, "r3")
        assert "/state/dev/nodes/node-1/env" in line and "pip install -r requirements.txt" in line
        assert "/state/dev/nodes/node-1/runs/r3/env" in line and SECRET not in line  # the file's path, not values
        if runtime == "docker":
            assert " run --rm " in f" {line} " and "img:1" in line and "-w /state/dev/nodes/node-1/code/project" in line
        else:
            assert line.startswith("cd /state/dev/nodes/node-1/code/project && ")


def test_the_cli_reads_env_names_from_the_callers_environment(monkeypatch):
    from multinode.cli import _launch_spec, build_parser

    monkeypatch.setenv("HF_TOKEN", SECRET)
    args = build_parser().parse_args(["train", "--script", "-m pkg.train", "--workdir", "proj", "--nproc", "auto",
                                      "--env", "HF_TOKEN EPOCHS=3", "--setup", "pip install -r requirements.txt"])
    spec = _launch_spec(args)
    assert [(v.name, v.value) for v in spec.env] == [("HF_TOKEN", SECRET), ("EPOCHS", "3")]
    assert spec.nproc == "auto" and spec.workdir == "proj" and spec.module == "pkg.train" and spec.args == ()
    assert SECRET not in repr(spec)


def test_the_sync_line_groups_nodes_with_the_same_outcome():
    from pathlib import Path

    from multinode.code.sync import describe_sync, node_list
    from multinode.code.workdir import Project

    assert node_list([f"node-{i}" for i in range(64)]) == "node-0..node-63"
    assert node_list(["node-0", "node-2", "node-3", "node-5"]) == "node-0, node-2..node-3, node-5"
    assert node_list(["node-1"]) == "node-1"
    local = Manifest({"a.py": FileEntry(3, 0o644, "x"), "pkg/b.py": FileEntry(5, 0o644, "y")})
    edited = Manifest({**local.files, "pkg/b.py": FileEntry(5, 0o644, "z")})
    plans = {f"node-{i}": plan_sync(edited, local) for i in range(63)}
    plans["node-63"] = plan_sync(edited, Manifest({}))  # a new node gets everything
    line = describe_sync(Project(Path("/p"), edited, "git: tracked or not ignored in /p"), plans)
    assert line == ("sync /p (2 files, 8 B; git: tracked or not ignored in /p): node-0..node-62 sent 1 file (5 bytes), "
                    "deleted 0; node-63 sent 2 files (8 bytes), deleted 0")


@pytest.mark.parametrize("name, mode, refused", [
    ("MASTER_ADDR", "mpi", "which the launcher sets on every rank (torch's env:// contract)"),  # mpirun sets it now
    ("RANK", "cpu", "which the launcher sets on every rank (torch's env:// contract)"),
    ("NCCL_SOCKET_IFNAME", "gpu", "which the launcher sets on every rank in MODE=gpu"),
    ("NCCL_SOCKET_IFNAME", "mpi-gpu", None),  # mpirun's ranks get no NCCL pinning: the name is the user's
    ("NCCL_SOCKET_IFNAME", "cpu", None),
    ("NCCL_SOCKET_IFNAME", None, "in MODE=gpu"),  # mode not known: the reason says which mode sets it
    ("PATH", "cpu", "which the launch itself needs"),
])
def test_env_refuses_only_what_the_mode_sets_and_says_who_sets_it(name, mode, refused):
    if refused is None:
        assert [v.name for v in parse_env(f"{name}=x", {}, mode=mode)] == [name]
        return
    with pytest.raises(UserError) as err:
        parse_env(f"{name}=x", {}, mode=mode)
    assert str(err.value).startswith(f"ENV names {name}, ") and refused in str(err.value)
    assert str(err.value).endswith("; choose another name")
