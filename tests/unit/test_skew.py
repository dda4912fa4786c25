"""Skew comparison (pure) and the code hash the nodes must match."""

from __future__ import annotations


import pytest

from multinode.config import LaunchSpec
from multinode.errors import UserError
from multinode.skew import code_hash, skew_table

SAME = {"python": "3.11.7", "torch": "2.13.0+cpu", "torch CUDA": None, "NCCL": None, "mpi4py": "4.1.2"}


def test_the_same_software_everywhere_is_no_table():
    assert skew_table({"node-0": SAME, "node-1": dict(SAME)}, "node-0") is None


def test_a_difference_names_the_node_and_shows_only_the_differing_versions_side_by_side():
    reports = {"node-0": SAME, "node-1": dict(SAME), "node-2": {**SAME, "torch": "2.12.0+cu126", "torch CUDA": "12.6"}}
    table = skew_table(reports, "node-0")
    lines = table.splitlines()
    assert lines[0] == "node-2 runs other software than node-0 (torch 2.12.0+cu126 vs 2.13.0+cpu, torch CUDA 12.6 vs None):"
    assert [line.split() for line in lines[1:]] == [["node", "torch", "torch", "CUDA"],
                                                    ["node-0", "2.13.0+cpu", "None"], ["node-2", "2.12.0+cu126", "12.6"]]
    assert "node-1" not in table  # same as the head: not listed


def test_several_odd_nodes_are_counted():
    reports = {"node-0": SAME, "node-1": {**SAME, "mpi4py": "4.0.0"}, "node-2": {**SAME, "mpi4py": "4.0.0"}}
    assert skew_table(reports, "node-0").splitlines()[0].endswith("; 1 more node(s) differ:")


def test_code_hash_ignores_bytecode_and_caches(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = code_hash([(tmp_path / "pkg", "training")])
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert code_hash([(tmp_path / "pkg", "training")]) == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert code_hash([(tmp_path / "pkg", "training")]) != before


def test_skew_setting():
    assert LaunchSpec().skew == "refuse" and LaunchSpec(skew="warn").skew == "warn"
    with pytest.raises(UserError, match="SKEW='maybe' is not one of refuse, warn"):
        LaunchSpec(skew="maybe")


def test_one_probe_reports_versions_and_the_code_hash():
    import shlex

    from multinode.skew import CODE_HASH, VERSIONS, probe_command

    argv = shlex.split(probe_command("/venv/bin/python", "/w/node-1/code", ["training"], versions=True, mpi=True))
    assert argv[:2] == ["/venv/bin/python", "-c"] and argv[2] == VERSIONS + "\n" + CODE_HASH
    assert argv[3:] == ["mpi", "/w/node-1/code", "training"]
    only_code = shlex.split(probe_command("python3", "/c", ["user/x.py"], versions=False, mpi=False))
    assert "importlib.metadata" not in only_code[2] and only_code[3:] == ["-", "/c", "user/x.py"]
