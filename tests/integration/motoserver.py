"""A real moto server on loopback for the AWS tests (moto[server], a dev dependency): started on a free port,
waited for until it answers, stopped at the block's end. One place for what test_aws_moto.py, bucket_server.py
and test_wheel_install.py each started by hand.

moto's own log is kept (:class:`MotoServer`): werkzeug's line per request (method, path, status) and the traceback of
any request moto failed, in a file beside the server. A test shows the part of it written during the test when the
test fails (test_aws_moto's ``ec2`` fixture prints it at teardown, which pytest reports only for a failed test), and
the whole tail is printed when the block itself fails: a cold run's odd answer (a 500, a 409 LimitExceeded on
AddRoleToInstanceProfile) is then on the record with its neighbours, not lost to /dev/null.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MOTO = Path(sys.executable).with_name("moto_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer(str):
    """The server's URL (a plain ``str`` to its users), and its log file."""

    log: Path

    def mark(self) -> int:
        """Where the log ends now (a later :meth:`since` starts there)."""
        return self.log.stat().st_size if self.log.exists() else 0

    def since(self, mark: int) -> str:
        with open(self.log, "rb") as fh:
            fh.seek(mark)
            return fh.read().decode(errors="replace")

    def show_since(self, mark: int, what: str = "moto's log during this test") -> None:
        """Print the log written since ``mark`` to stderr (pytest shows a test's stderr when the test fails)."""
        text = self.since(mark)
        print(f"--- {what} ({self.log}) ---\n{text[-20000:]}", file=sys.stderr)


@contextlib.contextmanager
def moto_server(**env: str) -> Iterator[MotoServer]:
    """The server's URL (``http://127.0.0.1:<port>``) while it runs; ``env``: moto's own switches
    (MOTO_IAM_LOAD_MANAGED_POLICIES, MOTO_ENABLE_RECORDING, ...)."""
    port = free_port()
    url = MotoServer(f"http://127.0.0.1:{port}")
    url.log = Path(tempfile.mkdtemp(prefix="moto-log-")) / f"moto-{port}.log"
    with open(url.log, "wb") as log:
        proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url}; its log: {url.since(0)[-2000:]}") from None
                time.sleep(0.1)
        yield url
    except BaseException:
        url.show_since(max(0, url.mark() - 20000), "the end of moto's log")
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=10)
