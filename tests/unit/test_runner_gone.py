"""RemoteRunner.vanished: the provider's word that a node's machine is gone, asked when a job fails or a run is
swept, remembered until the node is replaced; a stop does not open a connection to such a node."""

from __future__ import annotations

from dataclasses import replace

from conftest import make_inventory

from multinode.ssh.runner import RemoteRunner


def _runner(answers: list):
    asked = []

    def gone(names):
        asked.append(list(names))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {name: why for name, why in answer.items() if name in names}

    return RemoteRunner(make_inventory(3), gone=gone), asked


def test_what_the_provider_says_is_gone_is_remembered_until_the_node_is_replaced():
    runner, asked = _runner([{"node-2": "its network namespace is gone"}, {}, RuntimeError("throttled"), {}])
    assert runner.vanished() == {"node-2": "its network namespace is gone"}
    assert runner.vanished(["node-1", "node-2"]) == {"node-2": "its network namespace is gone"}  # still gone
    assert runner.vanished(["node-0"]) == {}  # a question that fails: cannot tell, nothing new
    assert asked == [["node-0", "node-1", "node-2"], ["node-1", "node-2"], ["node-0"]]
    inv = runner.inventory
    replaced = replace(inv, nodes=[*inv.nodes[:2], replace(inv.nodes[2], private_ip="10.200.7.99")])
    runner.retarget(replaced)  # node-2 is another machine now
    assert runner.gone == {} and runner.vanished() == {}


def test_a_runner_that_cannot_ask_knows_of_no_gone_node():
    assert RemoteRunner(make_inventory(2)).vanished() == {}


def test_the_stop_does_not_open_a_connection_to_a_gone_node(monkeypatch):
    runner, _ = _runner([{"node-1": "instance i-0abc is terminated", "node-2": "instance i-0def is terminated"}])
    asked = []  # the stop asks the provider first

    def run_with_input(name, command, **kwargs):
        asked.append(name)
        return b"stopped 2\n"

    monkeypatch.setattr(runner, "run_with_input", run_with_input)
    answers = runner.stop_all("run-1")
    assert asked == ["node-0"]
    assert answers["node-0"].ok and answers["node-0"].stdout == "stopped 2\n"
    assert (answers["node-2"].exit_code, answers["node-2"].error) == (None, "gone (instance i-0def is terminated)")
    assert sorted(answers) == ["node-0", "node-1", "node-2"]
