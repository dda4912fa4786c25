"""Whole-line streaming, line relabelling and stop signals (pure: no sockets)."""

from __future__ import annotations

import io
import os
import signal
import threading
from collections import deque
from pathlib import Path

import pytest

from multinode.plan.launchers.mpirun import relabel_by_rank
from multinode.checks.preflight import _check_script, port_check, split_reads
from multinode.ssh.lines import LineSink
from multinode.ssh.signals import StopSignals


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
    assert relabel("node-0", "[1,3]<stdout>:hello") == [("node-1", "[rank3]: hello")]
    assert relabel("node-0", "[1,0]<stderr>:  indented") == [("node-0", "[rank0]:   indented")]  # the text as written
    assert relabel("node-0", "mpirun noticed that ...") == [("node-0", "mpirun noticed that ...")]


def test_preflight_script_reports_each_failed_check():
    script = _check_script([("python with torch", "false"), port_check(29500)])
    assert 'FAIL python with torch' in script and "FAIL rendezvous port 29500 is free" in script


def test_preflight_round_output_splits_into_the_checks_and_each_read():
    stdout = ("FAIL x: y\n"  # the checks
              "\ntok versions\n{\"torch\": \"2.13.0\"}\n"
              "\ntok manifest\n{\"a.py\": [1, 420, \"ab\"]}"  # no newline at the end
              "\ntok empty\n")
    checks, reads = split_reads(stdout, "tok")
    assert checks == "FAIL x: y\n"
    assert reads == {"versions": '{"torch": "2.13.0"}\n', "manifest": '{"a.py": [1, 420, "ab"]}', "empty": ""}
    assert split_reads("all fine\n", "tok") == ("all fine\n", {})


def test_only_a_lost_or_killed_non_head_node_with_budget_left_rejoins():
    from multinode.app.watchers import Rejoin
    from multinode.core.events import NodeEnded

    policy = Rejoin(budget=1, wait=5, prepare=lambda name: None, exclude=("node-0",))
    lost = NodeEnded("node-1", None, lost=True)
    killed = NodeEnded("node-1", -1)  # SSH reports a launcher killed by a signal as -1
    shell_killed = NodeEnded("node-1", 137)
    failed = NodeEnded("node-1", 1)  # torchrun's own verdict: its restarts ran out
    assert all(policy.allows(event, 0) for event in (lost, killed, shell_killed))
    assert not policy.allows(failed, 0)
    assert not policy.allows(NodeEnded("node-0", None, lost=True), 0)  # the head hosts the rendezvous
    assert not policy.allows(lost, 1)  # budget spent
    assert not policy.allows(NodeEnded("node-1", None, lost=True, final=True), 0)  # its relaunch already failed


@pytest.mark.parametrize("sig", StopSignals.SIGNALS)
def test_stop_signals_are_recorded_while_a_job_runs_and_restored_after(sig):
    before = signal.getsignal(sig)
    with StopSignals() as stop:
        os.kill(os.getpid(), sig)  # delivered to this (main) thread: recorded, not raised
        os.kill(os.getpid(), signal.SIGINT)  # a second signal does not replace the first
        assert stop.signum == sig
    assert signal.getsignal(sig) == before


FIXTURE = Path(__file__).parent / "fixtures" / "mpirun"


def test_mpirun_chunks_become_each_ranks_whole_lines():
    """A recorded mpirun stderr (Open MPI 4.1.4): rank 0's traceback arrived in chunks tagged mid-line. After the
    sink, every rank's lines read as the traceback Python printed (tags gone, indentation and carets kept)."""
    out, log, tail = io.StringIO(), io.StringIO(), deque(maxlen=100)
    sink = LineSink("node-0", threading.Lock(), log, out, tail, relabel_by_rank(["node-0", "node-1"]))
    raw = (FIXTURE / "raises.stderr").read_text()
    for i in range(0, len(raw), 7):  # however the bytes arrive
        sink.write(raw[i:i + 7])
    sink.close()
    shown = out.getvalue().splitlines()
    ranks = [[line.split(f"[{node}] [rank{rank}]: ", 1)[1] for line in shown if line.startswith(f"[{node}] [rank{rank}]: ")]
             for rank, node in ((0, "node-0"), (1, "node-1"))]
    # rank 1's traceback arrived line by line: rank 0's, re-assembled from its chunks, reads the same
    assert ranks[0] == [line.replace("missing-key-1", "missing-key-0") for line in ranks[1]]
    assert ranks[1][:3] == ["Traceback (most recent call last):", '  File "/tmp/mpi-raise.py", line 7, in <module>',
                            "    outer()"]
    assert ranks[1][5].strip() and set(ranks[1][5].strip()) == {"^"} and len(ranks[1]) == 10
    assert not any("<stderr>" in line for line in shown)
    # mpirun's own lines stay whole and under the head; the log holds the same lines without the node
    assert "[node-0]   Process name: [[17915,1],0]" in shown
    assert log.getvalue().splitlines() == [line.split("] ", 1)[1] for line in shown]


def test_tagged_lines_keep_a_writers_unfinished_line_across_other_writers():
    relabel = relabel_by_rank(["node-0", "node-1"])
    assert relabel("node-0", "[1,0]<stdout>:Trace[1,1]<stdout>:hello") == [("node-1", "[rank1]: hello")]
    assert relabel("node-0", "[1,0]<stdout>:back") == [("node-0", "[rank0]: Traceback")]
    assert relabel("node-0", "[1,0]<stdout>:half") == [("node-0", "[rank0]: half")]
    assert relabel("node-0", "[1,1]<stderr>:cut off[1,1]<stdout>:") == [("node-1", "[rank1]: ")]
    assert relabel.close("node-0") == [("node-1", "[rank1]: cut off")]  # what a killed rank left unfinished
    assert relabel("node-0", "[1,7]<stdout>:no such rank") == [("node-0", "[1,7]<stdout>:no such rank")]
