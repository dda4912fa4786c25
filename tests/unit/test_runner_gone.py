"""The provider's word that a node's machine is gone, in the run's attempt loop (multinode.app.watchers.GoneWatch): asked
every GONE_POLL seconds for the job's nodes not yet known gone, each gone node said once; a question that fails is
"cannot tell". The runner itself knows nothing of it: a stop goes to the nodes it is given."""

from __future__ import annotations

import threading

from conftest import make_inventory

from multinode.app import watchers as watch
from multinode.core.events import Events, NodeGone
from multinode.ssh.runner import RemoteRunner


def test_each_gone_node_is_said_once_and_no_longer_asked(monkeypatch):
    monkeypatch.setattr(watch, "GONE_POLL", 0.01)
    answers = [{"node-2": "its network namespace is gone"}, {}, {"node-1": "instance i-1 is terminated"}]
    asked = []

    def gone(names):
        asked.append(list(names))
        return answers.pop(0) if answers else {}

    events = Events()
    watcher = watch.GoneWatch(gone, ["node-0", "node-1", "node-2"], events).start()
    said = [events.take(5), events.take(5)]
    watcher.stop()
    assert said == [NodeGone("node-2", "its network namespace is gone"), NodeGone("node-1", "instance i-1 is terminated")]
    assert asked[:3] == [["node-0", "node-1", "node-2"], ["node-0", "node-1"], ["node-0", "node-1"]]


def test_the_stop_goes_only_to_the_nodes_it_is_given(monkeypatch):
    runner = RemoteRunner(make_inventory(3))
    asked = []

    def run_with_input(name, command, **kwargs):
        asked.append(name)
        return b"stopped 2\n"

    monkeypatch.setattr(runner, "run_with_input", run_with_input)
    answers = runner.stop_all("run-1", names=["node-0"])
    assert asked == ["node-0"] and sorted(answers) == ["node-0"] and answers["node-0"].stdout == "stopped 2\n"
    assert not hasattr(runner, "gone") and not hasattr(runner, "vanished")


def test_a_cut_off_in_the_background_returns_before_the_nodes_answer_and_uses_the_addresses_of_its_call(monkeypatch):
    """The survivors' cut-off at a loss runs on a thread (the attempt loop takes the next events meanwhile); its
    command names the lost node's address as it was when asked, TCP sockets only."""
    runner = RemoteRunner(make_inventory(3))
    lost_ip = {n.name: n.private_ip for n in runner.inventory.nodes}["node-2"]
    returned, done, asked = threading.Event(), threading.Event(), []

    def run_each(commands, timeout=30.0):  # the nodes answer only once the caller has its answer
        asked.append((commands, returned.wait(5)))
        done.set()
        return {}

    monkeypatch.setattr(runner, "run_each", run_each)
    assert runner.cut_off(["node-2"], ["node-0", "node-1"], background=True) == {}
    runner.inventory = make_inventory(2)  # the lost node's name no longer in the inventory: the call's address stands
    returned.set()
    assert done.wait(10)
    commands, caller_had_returned = asked[0]
    assert caller_had_returned, "the cut-off held its caller until the nodes answered"
    assert sorted(commands) == ["node-0", "node-1"] and f"ss -K -t dst {lost_ip}" in commands["node-0"]
