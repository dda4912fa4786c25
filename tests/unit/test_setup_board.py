"""SETUP on several nodes seen on a terminal (multinode.code.setup.SetupBoard): one updating line instead of every
node's output, its end, and a failed node's last lines from its log."""

from __future__ import annotations

import io
from types import SimpleNamespace

from multinode.code.setup import SCRIPT, SetupBoard


def test_every_node_line_is_read_and_one_line_is_rewritten_until_all_are_done(tmp_path):
    out = io.StringIO()
    board = SetupBoard(["node-0", "node-1"], out)
    assert board.observe("node-0", "SETUP: pip install -r requirements.txt")
    assert board.observe("node-1", "Collecting numpy")
    assert board.observe("node-0", "SETUP: done on this node")
    assert board.observe("node-1", "SETUP: inputs unchanged since the last run on this node; skipped")
    board.end(SimpleNamespace(kind="succeeded", failure=None), tmp_path)
    text = out.getvalue()
    assert "\n" not in text.rstrip("\n")  # one line, rewritten in place (carriage returns), ended once
    assert "1 of 2 nodes done; node-1: Collecting numpy" in text
    assert text.rstrip("\n").rsplit("\r", 1)[1].startswith("[multinode] setup: 2 of 2 nodes done (")
    assert "SETUP: done on this node" in SCRIPT  # the line the board counts a node by


def test_a_failed_node_ends_the_line_and_its_last_log_lines_follow(tmp_path):
    out = io.StringIO()
    board = SetupBoard(["node-0", "node-1"], out)
    board.observe("node-0", "SETUP: done on this node")
    board.observe("node-1", "ERROR: No matching distribution found for nosuchpkg")
    (tmp_path / "node-1.log").write_text("SETUP: pip install nosuchpkg\nERROR: No matching distribution found for nosuchpkg\n")
    board.end(SimpleNamespace(kind="failed", failure=SimpleNamespace(node="node-1")), tmp_path)
    lines = out.getvalue().rsplit("\r", 1)[1].splitlines()
    assert lines[0].startswith("[multinode] setup: 1 of 2 nodes done; SETUP failed (")
    assert lines[1:] == ["[node-1] SETUP: pip install nosuchpkg",
                         "[node-1] ERROR: No matching distribution found for nosuchpkg"]
