"""The cluster's claim, pure parts: the head's holder command and the refusal line (the real lock on real sshd nodes
is tests/integration/test_claim_local.py)."""

from __future__ import annotations

from multinode.backends.claim import (BUSY_EXIT, busy_message, holder_command, lock_path, owner_line, parse_owner,
                                    release_command)


def test_the_lock_lies_in_the_heads_work_directory(inventory):
    assert lock_path(inventory) == "/state/dev/nodes/node-0/busy.lock"


def test_the_holder_takes_the_lock_without_waiting_and_leaves_a_process_that_holds_it_while_the_connection_lasts():
    import shlex

    argv = shlex.split(holder_command("/w/node 0/busy.lock", "run-1 pid=7 host=ctl since=now"))
    assert argv[:3] == ["exec", "sh", "-c"] and len(argv) == 4  # POSIX sh whatever the login shell
    command = argv[3]
    assert "flock -n 9" in command and f"exit {BUSY_EXIT}" in command
    assert "exec 9<>'/w/node 0/busy.lock'" in command  # opened without truncating: the owner stays readable
    assert "'run-1 pid=7 host=ctl since=now'" in command
    assert command.index("TAKEN") < command.index("tail --pid=$s") < command.index("HELD")
    assert "case $c in sshd*) s=$p" in command  # tied to the sshd process of this connection


def test_a_release_empties_the_owner_only_while_its_holder_holds_the_lock_and_waits_for_the_holder():
    command = release_command("/w/busy.lock", "run-1", 4242)
    alive = "read -r _ c z _ 2>/dev/null < /proc/4242/stat && [ \"$c\" = '(tail)' ] && [ \"$z\" != Z ]"
    assert command.startswith(f"if {alive} && read -r was _ < /w/busy.lock && [ \"$was\" = run-1 ]; then : > /w/busy.lock; fi")
    assert f"{alive} && kill 4242;" in command and f"while {alive} && " in command


def test_a_busy_cluster_is_one_line_naming_the_run_and_how_to_wait_follow_or_stop_it():
    line = busy_message("dev", "20261124-0501-abc pid=4242 host=ctl since=2026-11-24 05:01:02 UTC")
    assert "\n" not in line
    assert line.startswith("cluster 'dev' is busy: run 20261124-0501-abc is in progress (orchestrator pid 4242 on ctl, "
                           "since 2026-11-24 05:01:02 UTC)")
    assert "QUEUE=1" in line and "make logs RUN=20261124-0501-abc" in line and "kill 4242" in line
    assert "run ? is in progress" in busy_message("dev", "")  # an owner not written yet still reads as one line


def test_an_owner_line_names_the_run_this_process_and_this_host():
    import os
    import socket

    run_id, pid, host, since = parse_owner(owner_line("r-1"))
    assert (run_id, pid, host) == ("r-1", str(os.getpid()), socket.gethostname()) and since.endswith("UTC")
