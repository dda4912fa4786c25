"""The run's writes of the job's membership (multinode.app.members): a leave's cut-off and new generation, in order,
off the attempt loop."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from conftest import make_inventory

from multinode.app.members import Members


def test_a_leave_writes_the_new_generation_only_after_the_cut_off_and_does_not_hold_its_caller():
    """The survivors' cut-off runs before the new generation reaches them (one that had it would form the new group
    while another survivor's cut still closes its connections: the recovery benchmark's cut row failed so, both
    survivors exiting on 'Connection reset by peer'), both on the writer thread, two leaves in order."""
    order, cut_may_end = [], threading.Event()

    class Runner:
        def parallel(self, fn, names, timeout):
            return {name: fn(name) for name in names}

        def put_bytes(self, name, path, data):
            order.append(("write", name, json.loads(data)["generation"]))

    def cut(label):
        def first():
            assert cut_may_end.wait(5)
            order.append(("cut", label))
        return first

    ctx = SimpleNamespace(runner=Runner(), inv=make_inventory(4), spec=SimpleNamespace(run_id="r1"))
    members = Members(ctx, nproc=1, enabled=True, say=lambda line: None)
    assert members.leave("node-3", first=cut("node-3")).generation == 1
    members.leave("node-2", first=cut("node-2"))
    assert order == [] and members.names == ["node-0", "node-1"]  # the account changed; nothing sent yet
    cut_may_end.set()
    members.settle()
    assert order == [("cut", "node-3"), ("write", "node-0", 1), ("write", "node-1", 1), ("write", "node-2", 1),
                     ("cut", "node-2"), ("write", "node-0", 2), ("write", "node-1", 2)]
