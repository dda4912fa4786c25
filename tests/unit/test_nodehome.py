"""Which local nodes get a home of their own, and how (pure: the steps are only built here; one runs for real in
tests/integration/test_node_scripts.py)."""

from __future__ import annotations

from pathlib import Path

from multinode.providers.local.home import own_home_steps


def test_the_home_is_overlaid_with_the_nodes_own_upper_layer(tmp_path: Path):
    home, state = tmp_path / "home", tmp_path / "state" / "dev"
    home.mkdir()
    (step,) = own_home_steps(home, state, state / "provider" / "node-1")
    assert (f"mount -t overlay multinode-home -o lowerdir={home},upperdir={state}/provider/node-1/home,"
            f"workdir={state}/provider/node-1/home.work {home};" in step)
    assert step.startswith("{ mkdir -p ") and "--reference" in step


def test_the_home_stays_shared_where_the_state_lies_inside_it_or_a_path_cannot_be_an_overlay_option(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    inside = home / "proj" / ".multinode" / "dev"
    assert own_home_steps(home, inside, inside / "provider" / "node-0") == []  # its tools read the nodes' files
    odd = tmp_path / "a,b" / "dev"
    assert own_home_steps(home, odd, odd / "provider" / "node-0") == []
    assert own_home_steps(tmp_path / "missing", tmp_path / "s", tmp_path / "s" / "n") == []
