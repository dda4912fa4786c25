"""Which local nodes get a home of their own, and how (pure: the steps are only built here)."""

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


def test_a_refused_overlay_leaves_the_home_shared_and_the_node_starting(tmp_path: Path):
    import subprocess

    home, state = tmp_path / "home", tmp_path / "state" / "dev"
    home.mkdir()
    node = state / "provider" / "node-0"
    node.mkdir(parents=True)
    (step,) = own_home_steps(home, state, node)
    # Where the overlay cannot be made (here: no mkdir or mount on PATH), the step still succeeds.
    res = subprocess.run(["/bin/sh", "-c", f"{step} && echo started"], capture_output=True, text=True,
                         env={"PATH": "/nonexistent"})
    assert res.stdout == "started\n"
    assert "the home stays shared" in (node / "sshd.log").read_text()


def test_the_home_stays_shared_where_the_state_lies_inside_it_or_a_path_cannot_be_an_overlay_option(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    inside = home / "proj" / ".multinode" / "dev"
    assert own_home_steps(home, inside, inside / "provider" / "node-0") == []  # its tools read the nodes' files
    odd = tmp_path / "a,b" / "dev"
    assert own_home_steps(home, odd, odd / "provider" / "node-0") == []
    assert own_home_steps(tmp_path / "missing", tmp_path / "s", tmp_path / "s" / "n") == []
