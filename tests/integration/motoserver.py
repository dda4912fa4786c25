"""A real moto server on loopback for the AWS tests (moto[server], a dev dependency): started on a free port,
waited for until it answers, stopped at the block's end. One place for what test_aws_moto.py, bucket_server.py
and test_wheel_install.py each started by hand."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MOTO = Path(sys.executable).with_name("moto_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(**env: str) -> Iterator[str]:
    """The server's URL (``http://127.0.0.1:<port>``) while it runs; ``env``: moto's own switches
    (MOTO_IAM_LOAD_MANAGED_POLICIES, MOTO_ENABLE_RECORDING, ...)."""
    port = free_port()
    proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
