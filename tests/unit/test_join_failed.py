"""A replacement whose ranks end before they join the running job (multinode.app.joins.Joins.ended): the job goes on
without it, its generation -- written to it alone -- is withdrawn so that the next join is not left waiting for a
generation nobody forms, and a replacement is asked again only when the ranks were killed (a fresh machine would fail
a bug of the job's own the same way). Before, the loop took such an end for a failure of the job: every rank of the
running job was stopped. Fakes stand in for the runner, the job and the recovery; the real path, a replacement's
rank killed before JOINING (training/faults.py), runs in tests/integration/test_survivors_local.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import make_inventory

from multinode.app.joins import Joins
from multinode.app.members import Members
from multinode.core.errors import NodeError
from multinode.core.events import NodeEnded


class Runner:
    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []

    def parallel(self, fn, names, timeout):
        return {name: fn(name) for name in names}

    def put_bytes(self, name, path, data):
        self.written.append((name, json.loads(data)["generation"]))


class Job:
    def __init__(self) -> None:
        self.departed: list[str] = []

    def depart(self, name: str) -> None:
        self.departed.append(name)

    def fail_node(self, name: str, message: str, lost: bool) -> NodeError:
        return NodeError(name, "job", 1, message, log_path=f"/runs/r1/{name}.log")


def _joins() -> tuple[Joins, Members, Runner, Job, list[str], list[str]]:
    runner, job, said, asked = Runner(), Job(), [], []
    ctx = SimpleNamespace(runner=runner, inv=make_inventory(3), spec=SimpleNamespace(run_id="r1", recover_wait=60))
    members = Members(ctx, nproc=1, enabled=True, say=said.append)
    members.leave("node-2")
    members.settle()
    members.formed = 1  # the survivors formed the world without node-2
    recovery = SimpleNamespace(timeline=SimpleNamespace(add=lambda event, detail, at=None: said.append(event)),
                               replacements=SimpleNamespace(ask=asked.append))
    return Joins(ctx, job, members, recovery, prepare=lambda name: None, say=said.append), members, runner, job, said, \
        asked


def test_a_replacement_killed_before_it_joined_is_asked_again_and_the_next_join_opens():
    joins, members, runner, job, said, asked = _joins()
    assert members.join("node-2").generation == 2  # written to node-2 alone
    pending: set[str] = set()
    assert joins.ended(NodeEnded("node-2", 137), pending)
    assert job.departed == ["node-2"] and asked == ["node-2"] and "node-2" in joins.leaving
    assert "join failed" in said and any("ended before they joined" in line for line in said), said
    assert members.generation == 1 and not members.pending  # withdrawn: the next change writes 2 again
    again = members.join("node-2")  # the replacement's replacement
    assert again.generation == 2 and members.pending_after("node-2") == members.formed
    joins.joining("node-2")  # its ranks are ready: the running ranks get generation 2
    assert runner.written[-2:] == [("node-0", 2), ("node-1", 2)] and members.names[-1] == "node-2"


def test_a_replacement_whose_ranks_failed_by_themselves_is_not_asked_again_and_its_log_is_named():
    joins, members, _runner, job, said, asked = _joins()
    members.join("node-2")
    assert joins.ended(NodeEnded("node-2", 1), set())
    assert asked == [] and "node-2" not in joins.leaving and job.departed == ["node-2"]
    assert any("failed before they joined (exited with code 1; its log: /runs/r1/node-2.log)" in line
               for line in said), said


def test_a_members_end_and_a_joining_part_that_ended_well_are_not_failed_joins():
    joins, members, _runner, job, _said, asked = _joins()
    assert not joins.ended(NodeEnded("node-1", 137), set())  # a member: the loss path's, not this one's
    members.join("node-2")
    for code in (0, 75):  # the job itself ended: the loop's ordinary end
        assert not joins.ended(NodeEnded("node-2", code), set())
    assert members.pending and not job.departed and not asked
