"""State you can always recover from, on a real local cluster: a damaged known_hosts and a truncated
inventory.json are one line each on every verb (no traceback), and `down` still removes everything
the provider made (namespaces, links, sshds), judged by the independent leak check (leakcheck.py)."""

from __future__ import annotations

import pytest
import leakcheck
from localcluster import bring_up

pytestmark = pytest.mark.integration

VERBS = (("status",), ("train", "--nodes", "2"), ("ssh", "0", "true"))


def assert_one_line(res, *fragments: str) -> None:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_damaged_state_is_one_line_and_down_leaves_nothing(tmp_path):
    from multinode.providers.local.netns import namespaces_of

    cluster = bring_up(tmp_path, 2, prefix="rs")
    state = cluster.state
    marks = leakcheck.marks(cluster.name, cluster.home)  # read while the cluster is whole
    try:
        good_hosts = state.known_hosts.read_bytes()
        state.known_hosts.write_bytes(good_hosts[:20] + b"\xff\xfe" + good_hosts[22:])
        for verb in VERBS:
            assert_one_line(cluster.cli(*verb, timeout=60), str(state.known_hosts), "is damaged", "make down")
        state.known_hosts.write_bytes(good_hosts)

        inventory = state.inventory_path.read_text()
        state.inventory_path.write_text(inventory[: len(inventory) // 3])
        for verb in VERBS:
            assert_one_line(cluster.cli(*verb, timeout=60), str(state.inventory_path), "is damaged", "make down")
        assert_one_line(cluster.cli("up", "--nodes", "2", timeout=60), str(state.inventory_path))
        assert namespaces_of(cluster.name), "the refused verbs must not have touched the cluster"
    finally:
        res = cluster.cli("down", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "nothing left" in res.stdout, res.stdout + res.stderr
    leakcheck.assert_nothing_left(marks)
    assert not state.root.exists() or not any(state.root.iterdir())
