"""A real moto S3 server for local nodes: ``moto_server`` on loopback (as test_aws_moto.py starts it), recording every
request it serves (moto's recorder: ``MOTO_ENABLE_RECORDING``), and a plain TCP relay from the cluster's bridge
address -- the one address of the host a local node reaches (its namespace has no default route) -- to it.
Nothing listens anywhere but on loopback and on the cluster's own bridge."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import time
from pathlib import Path

from motoserver import moto_server

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAMULTINODETEST", "AWS_SECRET_ACCESS_KEY": "never-shown-5ecret-value"}
ENV_NAMES = "AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_ENDPOINT_URL"  # ENV= for the nodes, by name




@contextlib.contextmanager
def moto_s3(recording: Path):
    """(url on loopback, the recording file): a moto_server that appends each request it serves to ``recording``."""
    with moto_server(MOTO_ENABLE_RECORDING="1", MOTO_RECORDER_FILEPATH=str(recording)) as url:
        yield url


def requests(recording: Path, probes: bool = False) -> list[tuple[str, str]]:
    """(method, path and query) of every request moto recorded; ``probes``: with pre-flight's one-byte reads of an
    object under DATA (``Range: bytes=0-0``, training/bucket.py ``missing``), which fetch nothing."""
    if not recording.exists():
        return []
    rows = [json.loads(line) for line in recording.read_text().splitlines() if line.strip()]
    return [(row["method"], row["url"].split("://", 1)[-1].partition("/")[2]) for row in rows
            if probes or (row.get("headers") or {}).get("Range") != "bytes=0-0"]


def bridge_address(inventory) -> str:
    """The host's address on a local cluster's bridge (``<subnet>.1``)."""
    return str(ipaddress.ip_network(inventory.subnet)[1])


@contextlib.contextmanager
def relay(host: str, target_port: int, pause: float = 0.0):
    """``http://host:<port>``: a TCP relay on ``host`` to 127.0.0.1:``target_port``, until the block ends; ``pause``
    seconds after each 16 KiB relayed (a slow link, for a sync that is still running when it is stopped)."""
    listener = socket.create_server((host, 0))
    listener.settimeout(0.2)
    stop, open_sockets = threading.Event(), []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while not stop.is_set() and (chunk := src.recv(16384 if pause else 65536)):
                dst.sendall(chunk)
                if pause:
                    time.sleep(pause)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", target_port))
            open_sockets.extend([client, upstream])
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.close()


def s3_client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")
