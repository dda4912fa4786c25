"""The provider's word that a node's machine is gone, in the run's attempt loop (multinode.app.watchers.GoneWatch): asked
every GONE_POLL seconds for the job's nodes not yet known gone, each gone node said once; a question that fails is
"cannot tell". The runner itself knows nothing of it: a stop goes to the nodes it is given."""

from __future__ import annotations


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
