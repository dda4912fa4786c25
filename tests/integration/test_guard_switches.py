"""The guard honours the switches docs/preemption.md documents (issue 38): ``MULTINODE_NOTICES=off`` and it never
asks the metadata service, so an armed notice sends its command no SIGTERM; ``MULTINODE_NOTICE_POLL`` and it polls
at that interval, not AWS's 5 s.

The metadata service is the local provider's own (``multinode.providers.local.imds.endpoint_server``: the server a
local node runs at 169.254.169.254), here on a free loopback port, in this process, so the test counts what the
guard asked it; the guard is a real process (``python -m training.guard``) and nothing else is started: no cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multinode.providers.local.imds import INSTANCE_ACTION, endpoint_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


class Endpoint:
    """The local metadata service on 127.0.0.1, counting the notice polls (GETs of ``spot/instance-action``) and
    writing the count to ``polls`` (the guarded command reads it)."""

    def __init__(self, root: Path):
        self.notice_file, self.polls = root / "notice.json", root / "polls"
        self.polls.write_text("0\n")
        self.server = endpoint_server(self.notice_file, "127.0.0.1", 0)
        base, count = self.server.RequestHandlerClass, [0]
        polls = self.polls

        class Counting(base):
            def do_GET(self):
                if self.path == INSTANCE_ACTION:
                    count[0] += 1
                    polls.write_text(f"{count[0]}\n")
                return super().do_GET()

        self.server.RequestHandlerClass = Counting
        self.count = count
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def arm(self) -> None:
        """An interruption notice, visible now (the body AWS documents, served by the local provider's code)."""
        now = time.time()
        self.notice_file.write_text(json.dumps({"kind": "interruption", "action": "terminate",
                                                "visible_at": now - 1, "action_at": now + 119}))

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_guard(endpoint: Endpoint, command: str, **env: str) -> subprocess.Popen:
    """``python -m training.guard --grace 5 -- sh -c COMMAND`` with the endpoint's variable and ``env``."""
    return subprocess.Popen([sys.executable, "-m", "training.guard", "--grace", "5", "--", "sh", "-c", command],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                 "AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url, **env})


def finished(proc: subprocess.Popen) -> tuple[int, str]:
    """(exit code, stderr) once the guard has ended; 60 s is a hang guard (each command ends on an event)."""
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the guard did not end: {err[-2000:]}") from None
    return proc.returncode, err


def test_notices_off_the_guard_never_asks_and_an_armed_notice_sends_no_sigterm(tmp_path):
    """Two guards side by side, each with its own armed notice: one with ``MULTINODE_NOTICES=off``, one polling every
    0.2 s. The first one's command ends only once the second one's has taken its SIGTERM (an event, not a time):
    by then the switched-off guard would have acted on its notice at its first poll, as it starts."""
    off_dir, on_dir = tmp_path / "off", tmp_path / "on"
    off_dir.mkdir(), on_dir.mkdir()
    with Endpoint(off_dir) as quiet, Endpoint(on_dir) as polled:
        quiet.arm()  # before the guard starts: its first poll would see it
        on = start_guard(polled, f"trap 'echo term > {on_dir}/termed; exit 3' TERM; touch {on_dir}/started; "
                                 "while :; do sleep 0.1; done", MULTINODE_NOTICE_POLL="0.2")
        # Armed once the command has set its trap, so the SIGTERM cannot come before it.
        threading.Thread(target=arm_when, args=(polled, on_dir / "started"), daemon=True).start()
        off = start_guard(quiet, f"trap 'echo term > {off_dir}/termed; exit 3' TERM; "
                                 f"until [ -e {on_dir}/termed ]; do sleep 0.1; done", MULTINODE_NOTICES="off")
        (on_code, on_err), (off_code, off_err) = finished(on), finished(off)
    assert on_code == 3 and (on_dir / "termed").read_text() == "term\n", on_err  # the test can fail: a notice acts
    assert polled.count[0] >= 1 and "spot interruption notice (terminate" in on_err
    assert off_code == 0 and not (off_dir / "termed").exists(), off_err
    assert quiet.count[0] == 0 and "spot interruption notice" not in off_err


def arm_when(endpoint: Endpoint, started: Path) -> None:
    """Arm the notice once ``started`` exists (the guarded command has set its trap)."""
    for _ in range(600):
        if started.exists():
            break
        time.sleep(0.05)
    endpoint.arm()


def test_notice_poll_sets_the_guards_interval(tmp_path):
    """Two guards side by side, neither notice armed: one with ``MULTINODE_NOTICE_POLL=0.2``, one with AWS's 5 s.
    The first one's command waits for its guard's fourth poll, then reads how many the other guard has made: at most
    two (its first as it starts, the next no sooner than 5 s later: ``Watcher._loop`` waits the interval between
    polls). An order of events -- four polls before the other's third -- not a duration; the other command ends
    once the first has read it. Were the setting ignored, both would poll every 5 s and the other, started first,
    would have made three or four by then (tried: the test fails so)."""
    fast_dir, slow_dir = tmp_path / "fast", tmp_path / "slow"
    fast_dir.mkdir(), slow_dir.mkdir()
    with Endpoint(fast_dir) as fast_end, Endpoint(slow_dir) as slow_end:
        slow = start_guard(slow_end, f"until [ -e {fast_dir}/read ]; do sleep 0.05; done")
        fast = start_guard(fast_end, f"until [ $(cat {fast_end.polls}) -ge 4 ]; do sleep 0.05; done; "
                                     f"cat {slow_end.polls} > {fast_dir}/seen; touch {fast_dir}/read",
                           MULTINODE_NOTICE_POLL="0.2")
        (fast_code, fast_err), (slow_code, slow_err) = finished(fast), finished(slow)
    assert fast_code == 0 and slow_code == 0, fast_err + slow_err
    seen = int((fast_dir / "seen").read_text())
    assert seen <= 2 and fast_end.count[0] >= 4, (seen, fast_end.count[0])


def test_a_bad_notice_poll_is_refused_in_one_line(tmp_path):
    with Endpoint(tmp_path) as endpoint:
        bad = start_guard(endpoint, "true", MULTINODE_NOTICE_POLL="soon")
        code, err = finished(bad)
    assert code == 2 and "MULTINODE_NOTICE_POLL='soon' is not a number of seconds" in err
