"""A real moto server on loopback for the AWS tests (moto[server], a dev dependency): started on a free port,
waited for until it answers, stopped at the block's end. One place for what test_aws_moto.py, bucket_server.py
and test_wheel_install.py each started by hand.

moto's own log is kept (:class:`MotoServer`): werkzeug's line per request (method, path, status) and the traceback of
any request moto failed, in a file beside the server; and, unless the caller records elsewhere, moto's recorder
(``MOTO_ENABLE_RECORDING``) writes every request with its body beside it, so the log names each request's action
(werkzeug's line says only ``POST /``). A test shows the part written during the test when the test fails
(test_aws_moto's ``ec2`` fixture prints it at teardown, which pytest reports only for a failed test), and the tail is
printed when the block itself fails: a cold run's odd answer (a 500, a 409 LimitExceeded on AddRoleToInstanceProfile:
two requests of that action, or one after a 5xx, would show which) is then on the record with its neighbours.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# moto's server, with a mend of moto 5.2.5 that a second apply needs (moto_mended.py says which and why)
MOTO = [sys.executable, str(Path(__file__).with_name("moto_mended.py"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _size(path: Path | None) -> int:
    return path.stat().st_size if path and path.exists() else 0


def _tail(path: Path | None, offset: int) -> str:
    if not path or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(min(offset, _size(path)))  # moto truncates its recording when it is reset
        return fh.read().decode(errors="replace")


_SPACE = re.compile(r"\s*")


def _entries(text: str) -> Iterator[dict]:
    """The recorded requests in ``text``. moto's recorder writes an entry and its newline in two calls, so two requests
    served at once (Terraform sends several) can put two entries on one line: read them as a stream of JSON values, not
    as lines; a value cut off by the file's end (a request being recorded now) ends the stream."""
    decoder, at = json.JSONDecoder(), 0
    while (at := _SPACE.match(text, at).end()) < len(text):
        try:
            entry, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        yield entry


def _action(entry: dict) -> str:
    """``METHOD path Action`` of one recorded request (a query-protocol body's Action, a JSON one's X-Amz-Target)."""
    body = entry.get("body") or ""
    if entry.get("body_encoded"):
        body = base64.b64decode(body).decode(errors="replace")
    action = (urllib.parse.parse_qs(body).get("Action") or [""])[0] or entry.get("headers", {}).get("X-Amz-Target", "")
    return f"{entry.get('method')} {entry.get('url', '')[:120]} {action}".rstrip()


class MotoServer(str):
    """The server's URL (a plain ``str`` to its users), its log file and its request record (None when the caller
    records elsewhere)."""

    log: Path
    requests: Path | None

    def mark(self) -> tuple[int, int]:
        """Where the log and the record end now (a later :meth:`since` starts there)."""
        return _size(self.log), _size(self.requests)

    def since(self, mark: tuple[int, int] = (0, 0)) -> str:
        text = _tail(self.log, mark[0])
        recorded = [_action(entry) for entry in _entries(_tail(self.requests, mark[1]))]
        return text + (f"--- the requests, in order ({len(recorded)}) ---\n" + "\n".join(recorded) if recorded else "")

    def show_since(self, mark: tuple[int, int], what: str = "moto's log during this test") -> None:
        """Print what moto logged and recorded since ``mark`` to stderr (pytest shows a failed test's stderr)."""
        print(f"--- {what} ({self.log}) ---\n{self.since(mark)[-30000:]}", file=sys.stderr)


@contextlib.contextmanager
def moto_server(**env: str) -> Iterator[MotoServer]:
    """The server's URL (``http://127.0.0.1:<port>``) while it runs; ``env``: moto's own switches
    (MOTO_IAM_LOAD_MANAGED_POLICIES, MOTO_ENABLE_RECORDING, ...)."""
    port = free_port()
    url = MotoServer(f"http://127.0.0.1:{port}")
    url.log = Path(tempfile.mkdtemp(prefix="moto-log-")) / f"moto-{port}.log"
    url.requests = None
    if "MOTO_ENABLE_RECORDING" not in env:
        url.requests = url.log.with_suffix(".requests.jsonl")
        env = {**env, "MOTO_ENABLE_RECORDING": "1", "MOTO_RECORDER_FILEPATH": str(url.requests)}
    with open(url.log, "wb") as log:
        proc = subprocess.Popen([*MOTO, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url}; its log: {url.since()[-2000:]}") from None
                time.sleep(0.1)
        yield url
    except BaseException:
        log_end, record_end = url.mark()
        url.show_since((max(0, log_end - 20000), max(0, record_end - 200000)), "the end of moto's log")
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=10)
