"""Notices in a batch (multinode.app.notices) and the words for the snapshot a recovery resumed from -- pure: the
JSON the nodes' ``python imds.py`` prints, parsed; the window's arithmetic; the command planned. The real batch:
tests/integration/test_notice_batch_local.py."""

from __future__ import annotations

import calendar
import json
import time

from multinode.app import notices
from multinode.app.timeline import snapshot_kind

T0 = calendar.timegm(time.strptime("2026-11-25T10:00:00Z", "%Y-%m-%dT%H:%M:%SZ"))


def _answer(kind: str, at: str | None) -> str:
    return json.dumps({"kind": kind, "action": "terminate" if kind == "interruption" else None, "time": at,
                       "source": "imds"}) + "\n"


def test_only_interruptions_of_this_run_join_the_batch():
    answers = {
        "node-0": "null\n",
        "node-1": _answer("interruption", "2026-11-25T10:02:00Z"),
        "node-2": _answer("rebalance", "2026-11-25T10:00:01Z"),  # a risk, not a stop
        "node-3": _answer("interruption", "2026-11-25T09:59:59Z"),  # before the run started
        "node-4": "imds: unreachable",
        "node-5": _answer("interruption", "2026-11-25T10:00:00Z"),  # the run's own first second
    }
    assert notices.interrupted(answers, T0 + 0.5) == ["node-1", "node-5"]


def test_the_batch_starts_at_its_first_notice_seen_or_issued():
    issued_early = {"node-1": _answer("interruption", "2026-11-25T10:02:00Z")}  # issued 10:00:00
    assert notices.first_notice(T0 + 3.0, issued_early) == T0  # EC2 issued it before the rank saw it
    assert notices.first_notice(T0 - 1.0, issued_early) == T0 - 1.0
    assert notices.first_notice(None, {"node-2": _answer("rebalance", "2026-11-25T10:00:00Z")}) is None
    assert notices.first_notice(T0, {}) == T0  # a SIGTERM: only the rank's time


def test_the_window_is_what_is_left_of_5_s_after_the_first_notice():
    assert notices.COALESCE_SECONDS == 5.0
    assert notices.window_left(None, T0) == 0.0
    assert notices.window_left(T0, T0 + 1.5) == 3.5
    assert notices.window_left(T0, T0 + 30) == 0.0
    assert notices.window_left(T0 + 60, T0) == 5.0  # a clock ahead of ours never makes it longer


def test_the_poll_is_the_guards_copy_of_imds_with_the_node_interpreter(inventory):
    plain = notices.poll_command(inventory, "node-0", {})
    assert plain == "/repo/.venv/bin/python -I /state/dev/nodes/node-0/code/guard/imds.py 2>/dev/null", plain
    given = notices.poll_command(inventory, "node-0", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://10.1.1.1:80"})
    assert given == f"env AWS_EC2_METADATA_SERVICE_ENDPOINT=http://10.1.1.1:80 {plain}"


def test_the_recovery_says_which_snapshot_it_resumed_from():
    coordinated = {"epoch": 3, "consumed": 320, "step": 77, "snapshot_from": "h0:/r/snapshots/snapshot.pt"}
    periodic = {"epoch": 4, "consumed": 0, "step": 88, "snapshot_from": "h1:/r/snapshots/replica/snapshot.pt"}
    assert snapshot_kind(coordinated) == ("the coordinated checkpoint of step 77 (epoch 3, 320 samples in), "
                                          "h0:/r/snapshots/snapshot.pt")
    assert snapshot_kind(periodic).startswith("the periodic snapshot of step 88 (before epoch 4), h1:")
    assert snapshot_kind({}) == "no snapshot (a fresh start)"
