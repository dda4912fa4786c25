"""Whole-line streaming and line relabelling (pure: no sockets)."""

from __future__ import annotations

import io
import threading
from collections import deque

from multinode.launchers.mpirun import relabel_by_rank
from multinode.preflight import _check_script, port_check
from multinode.remote import LineSink


def test_sink_emits_whole_lines_only_and_keeps_a_tail():
    out, log, tail = io.StringIO(), io.StringIO(), deque(maxlen=2)
    sink = LineSink("node-1", threading.Lock(), log, out, tail)
    sink.write("par")
    assert out.getvalue() == ""  # half a line is held back
    sink.write("tial\nsecond\nthi")
    sink.close()  # the last, unterminated line is flushed at the end
    assert out.getvalue() == "[node-1] partial\n[node-1] second\n[node-1] thi\n"
    assert log.getvalue() == "partial\nsecond\nthi\n"
    assert list(tail) == ["second", "thi"]


def test_mpirun_lines_are_shown_under_the_ranks_node():
    relabel = relabel_by_rank(["node-0", "node-0", "node-1", "node-1"])  # 2 ranks per node
    assert relabel("node-0", "[1,3]<stdout>:hello") == ("node-1", "[rank3]: hello")
    assert relabel("node-0", "[1,0]<stderr>: warn") == ("node-0", "[rank0]: warn")
    assert relabel("node-0", "mpirun noticed that ...") == ("node-0", "mpirun noticed that ...")


def test_preflight_script_reports_each_failed_check():
    script = _check_script([("python with torch", "false"), port_check(29500)])
    assert 'FAIL python with torch' in script and "FAIL rendezvous port 29500 is free" in script
