"""Root-cause ranking and stack grouping on recorded captures (tests/unit/fixtures/stacks: real py-spy dumps
of a 3-rank gloo job whose rank 2 hangs while ranks 0 and 1 wait in all_reduce)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from multinode.diagnose.capture import CAPTURE, capture_command, parse_capture
from multinode.diagnose.dumps import Frame, RankDump, Sample
from multinode.diagnose.rank import pick_culprit, waiting
from multinode.diagnose.report import group_stacks, save
from multinode.diagnose.summary import RunSummary, describe as _describe

FIXTURES = Path(__file__).parent / "fixtures" / "stacks"


def recorded(name: str, node: str = "node-0") -> list[RankDump]:
    return parse_capture(node, (FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize("name, why, top", [
    ("sigstop", "is stopped (state T", "user_hang.py:51"),
    ("spin", "is running outside any collective or store wait (state R)", "spin_forever (user_hang.py:36): total += 1"),
    ("lock", "is blocked outside any collective or store wait (state S", "wait_for_the_lock (user_hang.py:41): guard.acquire()"),
])
def test_the_hung_rank_is_named_not_the_ranks_waiting_for_it(name, why, top):
    culprit = pick_culprit(recorded(name))
    assert culprit is not None and culprit.rank == 2
    assert culprit.why.startswith(why)
    assert top in culprit.top.describe()
    assert culprit.describe().startswith(f"rank 2 (pid {culprit.pid}) {why}")


@pytest.mark.parametrize("name", ["sigstop", "spin", "lock"])
def test_ranks_waiting_in_all_reduce_are_never_the_culprit(name):
    waiters = [d for d in recorded(name) if d.rank != 2]
    assert [d.last.frames[0].name for d in waiters] == ["all_reduce", "all_reduce"]
    assert pick_culprit(waiters) is None


def test_a_stopped_rank_outranks_a_spinning_one():
    stopped = [dataclasses.replace(d, rank=5, node="node-1") for d in recorded("sigstop") if d.rank == 2]
    culprit = pick_culprit(recorded("spin") + stopped)
    assert (culprit.node, culprit.rank) == ("node-1", 5)


def frame(name: str, file: str = "/code/user/job.py", line: int = 1, code: str = "") -> Frame:
    return Frame(name, file, line, code)


def dump(*samples: Sample, rank: int = 3) -> RankDump:
    return RankDump("node-1", 100 + rank, "r1", rank, samples)


def test_a_rank_only_passing_through_user_code_is_not_stuck():
    sleeping = Sample("S", 10, (frame("<module>", code="time.sleep(args.sleep)"),))
    in_collective = Sample("S", 11, (frame("all_reduce", "/x/site-packages/torch/distributed/distributed_c10d.py"),))
    assert pick_culprit([dump(sleeping, in_collective)]) is None  # moved into a collective
    assert pick_culprit([dump(sleeping, Sample(None))]) is None  # gone (exited) before the second look
    exiting = Sample("S", 12, (frame("print_exception", "/usr/lib/python3.11/traceback.py"), frame("<module>")))
    assert pick_culprit([dump(exiting, exiting)]) is None
    no_stack = Sample("R", 12, (), error="py-spy gave no answer within 5 s")
    assert pick_culprit([dump(no_stack, no_stack)]) is None


def test_uninterruptible_in_every_look_is_named_and_a_child_of_a_rank_is_not():
    d_state = Sample("D", 5, (frame("read_batch", code="f.read()"),))
    culprit = pick_culprit([dump(d_state, d_state)])
    assert culprit.why.startswith("is in uninterruptible sleep (state D")
    assert pick_culprit([dump(d_state, Sample("S", 5, d_state.frames))]) is not None  # same place, blocked
    child = dataclasses.replace(dump(d_state, d_state), parent_is_rank=True)
    assert pick_culprit([child]) is None
    # One look (taken when a node failed on its own) cannot tell a rank stuck in the kernel from one reading its
    # files (importing torch): it does not outrank that node (seen: a rank importing torch named over node-2's crash).
    assert pick_culprit([dump(d_state)]) is None


@pytest.mark.parametrize("frames, expected", [
    ((frame("step", code="comm.Allreduce(buf, out)"),), True),  # mpi4py: the C call shows as the caller's line
    ((frame("step", code="req.Wait()"),), True),
    ((frame("main", code="value = store.get('key')"),), True),
    ((frame("_engine_run_backward", "/v/site-packages/torch/autograd/graph.py"),), True),  # DDP's all-reduce
    ((frame("wait_for_the_lock", code="guard.acquire()"),), False),
    ((frame("wait", "/usr/lib/python3.11/threading.py", code="waiter.acquire()"),
      frame("_get_data", "/v/site-packages/torch/utils/data/dataloader.py"),), False),  # a stuck DataLoader
])
def test_what_counts_as_waiting_on_peers(frames, expected):
    assert waiting(frames) is expected


def test_identical_stacks_are_printed_once_with_their_ranks():
    text = group_stacks(recorded("spin"))
    assert text.count("all_reduce (torch/distributed/distributed_c10d.py:") == 1
    assert text.splitlines()[0] == "2 ranks (0 on node-0, 1 on node-0), sleeping:"
    assert "1 rank (2 on node-0), running:" in text and "spin_forever (user_hang.py:36): total += 1" in text


def test_save_writes_raw_readable_and_grouped_files(tmp_path):
    where = save(tmp_path / "stacks", {"node-2": recorded("lock", "node-2")}, {"node-0": "no answer within 16 s"})
    assert {p.name for p in where.iterdir()} == {"node-2.json", "node-2.txt", "node-0.txt", "stacks.txt"}
    readable = (where / "node-2.txt").read_text()
    assert "rank 2 pid" in readable and "sample 2: state S (sleeping)" in readable and "thread MainThread" in readable
    assert (where / "node-0.txt").read_text().startswith("no capture: no answer")


def test_capture_command_runs_the_snippet_with_the_node_python():
    argv = shlex.split(capture_command("/venv/bin/python", "r-1", samples=2))
    assert argv[:2] == ["/venv/bin/python", "-c"] and argv[2] == CAPTURE
    assert argv[3:] == ["r-1", "2", "0.5", "5.0"]
    assert shlex.split(capture_command("python3", None))[3] == ""  # every run


def test_summary_names_node_rank_why_and_where_the_stacks_are():
    summary = RunSummary(run_id="r1", mode="cpu", nodes=3, world_size=3, exit_codes={"node-0": 1}, wall_seconds=12.0,
                         result=None, log_dir="/runs/r1", metrics=None, failed_node="node-2", failed_rank=2,
                         cause="rank 2 (pid 7) is stopped (state T: ...); top of its stack: f (job.py:3)",
                         stacks="/runs/r1/stacks")
    text = _describe(summary)
    assert "first failure: node-2, rank 2" in text
    assert "root cause: node-2 rank 2 (pid 7) is stopped" in text
    assert "stacks at failure: /runs/r1/stacks/" in text


def node_error(node: str, *lines: str):
    from multinode.core.errors import NodeError

    return NodeError(node, "job", 1, "exited with code 1", tail=list(lines))


def test_a_node_that_failed_on_its_own_outranks_a_rank_merely_outside_a_collective():
    """A worker killed on node-1 (its log shows no peer's failure): ranks busy computing elsewhere are not blamed."""
    from multinode.diagnose.rank import root_cause

    busy = recorded("spin")  # rank 2 spinning outside a collective
    killed = node_error("node-1", "worker pid 7 died: Signals.SIGKILL")
    reacted = node_error("node-0", "RuntimeError: ... Timed out waiting 10000ms for recv operation to complete")
    assert root_cause(busy, [killed, reacted]) is None  # the caller names node-1 from its log
    assert root_cause(busy, [reacted]).rank == 2  # every failure reacted to the hang: the stuck rank is the cause
    stopped = recorded("sigstop")
    assert root_cause(stopped, [killed]).rank == 2  # a stopped rank outranks everything


def test_a_stall_names_the_rank_asleep_outside_a_collective_not_the_head_where_the_run_stopped_it(tmp_path):
    """A real capture (sleep.json): rank 1 sleeps in Python while ranks 0 and 2 wait in a barrier; the stall
    watchdog stopped the job. Its stop is recorded on the head with no exit code and no log: not a node's failure,
    so it does not hide the sleeping rank (it did: 'first failure: node-0, rank unknown'). A node's failure --
    with an exit code, or with a log and none (a lost session) -- still outranks a rank merely outside a collective."""
    from multinode.core.errors import NodeError
    from multinode.diagnose.rank import is_node_failure, root_cause

    dumps = recorded("sleep")
    stall = NodeError("node-0", "job", None, "no rank made progress (output or CPU time) for 15 s (STALL_TIMEOUT=15); "
                      "the job was stopped")
    assert not is_node_failure(stall)
    culprit = root_cause(dumps, [stall])
    assert culprit is not None and culprit.rank == 1
    assert culprit.why.startswith("is blocked outside any collective or store wait (state S")
    assert culprit.top.describe().endswith("time.sleep(args.seconds)")
    assert root_cause(dumps) == culprit  # what the run's stalled outcome asks: the capture alone
    crashed = node_error("node-2", "worker pid 7 died: Signals.SIGKILL")
    (tmp_path / "node-2.log").write_text("")  # lost its session: no exit code, a log without a peer's failure
    lost = NodeError("node-2", "job", None, "lost its SSH session", log_path=str(tmp_path / "node-2.log"))
    assert is_node_failure(crashed) and is_node_failure(lost)
    assert root_cause(dumps, [stall, crashed]) is None and root_cause(dumps, [lost]) is None


def test_ranks_in_different_collectives_name_the_odd_one_out():
    """A real capture: rank 0 waits in all_reduce, ranks 1-2 in broadcast. Every rank waits on its peers, so no
    verdict clears one; the mismatch names rank 0 (the watchdog's stop among the failures changes nothing)."""
    from multinode.core.errors import NodeError
    from multinode.diagnose.collectives import collective_of, mismatch
    from multinode.diagnose.rank import root_cause

    dumps = recorded("mismatch")
    assert [collective_of(d.last.frames) for d in dumps] == ["all_reduce", "broadcast", "broadcast"]
    assert pick_culprit(dumps) is None
    found = mismatch(dumps)
    assert found.describe() == "rank 0 in all_reduce, ranks 1-2 in broadcast: the ranks called different collectives"
    stall = NodeError("node-0", "job", None, "no rank made progress for 8 s", tail=["USER step 1 rank=0"])
    culprit = root_cause(dumps, [stall])
    assert (culprit.node, culprit.rank) == ("node-0", 0)
    assert culprit.describe().startswith(f"rank 0 (pid {culprit.pid}) is the odd one out: rank 0 in all_reduce, "
                                         "ranks 1-2 in broadcast: the ranks called different collectives; top of its "
                                         "stack: all_reduce (torch/distributed/distributed_c10d.py:")
    assert group_stacks(dumps).splitlines()[0] == f"different collectives: {found.describe()}"


@pytest.mark.parametrize("name", ["sigstop", "spin", "lock"])
def test_ranks_in_the_same_collective_are_no_mismatch(name):
    from multinode.diagnose.collectives import mismatch

    waiters = [d for d in recorded(name) if d.rank != 2]
    assert mismatch(waiters) is None  # both in all_reduce
    assert mismatch(recorded(name)) is None  # rank 2 is in none
    assert not group_stacks(recorded(name)).startswith("different collectives")


def test_two_even_groups_name_no_odd_one():
    from multinode.diagnose.collectives import mismatch, rank_list

    dumps = recorded("mismatch")
    even = [d for d in dumps if d.rank != 2]  # rank 0 in all_reduce, rank 1 in broadcast: which is wrong?
    assert mismatch(even).odd is None and mismatch(even).describe().startswith("rank 0 in all_reduce, rank 1 in")
    assert rank_list([5, 0, 3, 4]) == "ranks 0, 3-5" and rank_list([2]) == "rank 2"


def test_the_main_thread_is_found_by_its_os_thread_id_when_py_spy_gives_no_names():
    """py-spy lists a rank's other threads before its main one, and a thread's name is read from the interpreter:
    without names, the main thread is the one whose OS thread id is the pid, not the first listed."""
    import json

    frame = {"name": "step", "file": "/x/train.py", "line": 7, "code": "loss.backward()"}
    raw = {"ranks": [{"pid": 40, "run_id": "r", "rank": 0, "local_rank": "0", "ppid": 1, "samples": [
        {"state": "R", "cpu_ticks": 3, "threads": [
            {"name": "140001", "active": False, "os_thread_id": 42, "frames": []},
            {"name": "140002", "active": True, "os_thread_id": 40, "frames": [frame]}]}]}]}
    (dump,) = parse_capture("node-0", json.dumps(raw))
    assert [f.name for f in dump.last.frames] == ["step"] and dump.last.threads == 2
    raw["ranks"][0]["samples"][0]["threads"][1]["frames"] = []
    (dump,) = parse_capture("node-0", json.dumps(raw))
    assert "(no Python frames: py-spy listed 2 Python threads)" in group_stacks([dump])
