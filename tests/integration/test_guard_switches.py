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


@pytest.fixture
def endpoint(tmp_path):
    with Endpoint(tmp_path) as served:
        yield served


def guard(endpoint: Endpoint, command: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m training.guard --grace 5 -- sh -c COMMAND`` with the endpoint's variable and ``env``."""
    return subprocess.run([sys.executable, "-m", "training.guard", "--grace", "5", "--", "sh", "-c", command],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                               "AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url, **env})


def test_notices_off_the_guard_never_asks_and_an_armed_notice_sends_no_sigterm(endpoint, tmp_path):
    termed, started = tmp_path / "termed", tmp_path / "started"
    # Short sleeps under a trap that notes a SIGTERM: with the notice armed before the guard starts, its first poll
    # (as it starts) would act on it within the twenty of them (2 s).
    command = (f"trap 'echo term > {termed}; exit 3' TERM; touch {started}; "
               f"for i in $(seq {{n}}); do sleep 0.1; done")
    endpoint.arm()
    off = guard(endpoint, command.format(n=20), MULTINODE_NOTICES="off")
    assert off.returncode == 0 and not termed.exists(), off.stderr
    assert endpoint.count[0] == 0 and "spot interruption notice" not in off.stderr
    # The same notice with the switch not set (the test can fail): armed again once the trap is set, so the SIGTERM
    # cannot come before it; polled every 0.2 s, and the command waits up to 30 s for it.
    endpoint.notice_file.unlink()
    started.unlink()
    threading.Thread(target=arm_when, args=(endpoint, started), daemon=True).start()
    on = guard(endpoint, command.format(n=300), MULTINODE_NOTICE_POLL="0.2")
    assert on.returncode == 3 and termed.read_text() == "term\n", on.stderr
    assert endpoint.count[0] >= 1 and "spot interruption notice (terminate" in on.stderr


def arm_when(endpoint: Endpoint, started: Path) -> None:
    """Arm the notice once ``started`` exists (the guarded command has set its trap)."""
    for _ in range(600):
        if started.exists():
            break
        time.sleep(0.05)
    endpoint.arm()


def test_notice_poll_sets_the_guards_interval(endpoint, tmp_path):
    """With ``MULTINODE_NOTICE_POLL=0.2`` the command sees a third poll and ends. It waits for it 50 x 0.09 s (at
    least 4.5 s) at most, a window in which AWS's 5 s lets the guard poll once (the first poll comes at its start,
    the second no sooner than 5 s later: ``Watcher._loop`` waits the interval between polls) -- a count, not a
    duration: no notice is armed, so the polls go on until the command ends."""
    command = (f"for i in $(seq 50); do [ $(cat {endpoint.polls}) -ge 3 ] && exit 0; sleep 0.09; done; "
               f"echo \"only $(cat {endpoint.polls}) polls\" >&2; exit 1")
    res = guard(endpoint, command, MULTINODE_NOTICE_POLL="0.2")
    assert res.returncode == 0 and endpoint.count[0] >= 3, res.stderr
    bad = guard(endpoint, "true", MULTINODE_NOTICE_POLL="soon")
    assert bad.returncode == 2 and "MULTINODE_NOTICE_POLL='soon' is not a number of seconds" in bad.stderr
