"""What the orchestrator runs on a node, run for real on this host: the stop script on real processes, a
node's home step under /bin/sh, the software probe in a real interpreter, the head-reach check against real
sockets. They start subprocesses, so they are integration tests (tests/unit holds only pure ones)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from multinode.ssh.runner import STOP_SCRIPT

pytestmark = pytest.mark.integration


def stop(run_id: str, hundredths: int = 300, env: dict | None = None) -> str:
    res = subprocess.run(["sh", "-c", STOP_SCRIPT, "stop", run_id, str(hundredths)], capture_output=True, text=True,
                         timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_it_stops_every_process_of_its_run_and_nothing_else():
    run, other = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    ours = [subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": run}) for _ in range(3)]
    paused = subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": run})
    paused.send_signal(signal.SIGSTOP)  # acts on the TERM only once continued
    theirs = subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": other})
    try:
        time.sleep(0.1)
        assert stop(run) == "stopped 4"
        assert [p.wait(5) for p in ours + [paused]] == [-signal.SIGTERM] * 4
        assert theirs.poll() is None
        assert stop(run) == "stopped 0"
    finally:
        for p in ours + [paused, theirs]:
            p.kill()
            p.wait()


def test_its_kill_comes_at_the_deadline_however_slow_its_rounds(tmp_path: Path):
    """The wait between TERM and KILL is bounded by the clock, not by a count of rounds: here each round's sleep takes
    5 s (on a loaded node it was each round's listing of /proc), the grace 1 s. Counting 0.1 s rounds, the KILL came
    after 10 rounds, 50 s, past the hang guard (and, in a spot day's replay, past the caller's own timeout: the rank
    that ignored its TERM kept the rendezvous port into the next attempt)."""
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "sleep").write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 5\n")
    (slow / "sleep").chmod(0o755)
    run = f"t-{uuid.uuid4().hex[:8]}"
    deaf = subprocess.Popen(["sleep", "60"], env={**os.environ, "MULTINODE_RUN_ID": run},
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))  # a rank in C++
    try:
        time.sleep(0.1)
        assert stop(run, 100, env={**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}) == "stopped 1"
        assert deaf.wait(5) == -signal.SIGKILL
    finally:
        deaf.kill()
        deaf.wait()


def test_a_refused_overlay_leaves_the_home_shared_and_the_node_starting(tmp_path: Path):
    from multinode.providers.local.home import own_home_steps

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


def test_versions_probe_reads_distributions_like_importlib_metadata(tmp_path):
    """The probe's directory listing gives importlib.metadata's answer, first entry on the path winning."""
    import json
    import sys

    from multinode.checks.software import versions_probe

    first, second = tmp_path / "a", tmp_path / "b"
    for root, nccl, mpi in ((first, "2.29.7", None), (second, "2.27.3", "4.1.2")):
        (root / f"nvidia_nccl_cu13-{nccl}.dist-info").mkdir(parents=True)
        if mpi:
            (root / f"mpi4py-{mpi}.dist-info").mkdir()
    argv = shlex.split(versions_probe(sys.executable, mpi=False))
    env = {"PYTHONPATH": f"{first}:{second}", "PATH": "/usr/bin:/bin"}
    info = json.loads(subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout)
    assert info["NCCL"] == "2.29.7" and info["mpi4py"] == "4.1.2" and info["python"] == sys.version.split()[0]


def test_head_reach_check_takes_a_refused_rendezvous_port_as_reachable():
    """Nothing listens on the rendezvous port before the job: the head's refusal proves the route (loopback here);
    a listener there passes too (the head's own port check names it)."""
    import socket
    from types import SimpleNamespace

    from multinode.checks.preflight import head_reach_check

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]  # bound, never listening: a connection to it is refused
            inv = SimpleNamespace(head=SimpleNamespace(name="node-0", private_ip="127.0.0.1", ssh_port=open_port))
            for port in (closed_port, open_port, None):
                desc, command = head_reach_check(inv, port)
                res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=10)
                assert res.returncode == 0, (port, res.stdout, res.stderr)
            assert "at port" in head_reach_check(inv, closed_port)[0] and "at port" not in head_reach_check(inv, None)[0]
