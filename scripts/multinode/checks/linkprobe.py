"""The program every node runs for the link check (:mod:`multinode.checks.links`): stdlib Python only, so it
runs on any node with a ``python3`` (the host's, whatever runtime the job uses: containers share the host's
network).

    python3 -c "$PROBE" <name> <port> <window_s> <expected_incoming> <peer>=<ip>,...

It listens on ``port``, connects to each peer's, and on every connection measures:

* **round trip**: a few one-byte ping-pongs before any bulk data (the sender's figure);
* **bandwidth**: the receiver counts the bytes that arrive during ``window_s`` from the first bulk byte, then
  closes -- a throttled link cannot stretch the check with the megabytes a sender's socket buffer holds.

It prints one JSON line: ``{"name", "in": {peer: {"bytes", "seconds"}}, "out": {peer: {"rtt_ms"}}, "errors"}``.
The receiver closes first, so the end states of the connections stay on the senders' ephemeral ports.
"""

from __future__ import annotations

PROBE = r'''
import json, socket, statistics, sys, threading, time
name, port, window, expect = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
peers = [p.split("=", 1) for p in sys.argv[5].split(",") if p]
PINGS, CHUNK = 3, 1 << 18
deadline = time.monotonic() + window + 1.5
out = {"name": name, "in": {}, "out": {}, "errors": []}
lock = threading.Lock()

def note(kind, peer, value):
    with lock:
        out[kind][peer] = value

def receive(conn):
    try:
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        peer = b""
        while len(peer) < 64:
            got = conn.recv(64 - len(peer))
            if not got:
                raise OSError("closed before its name")
            peer += got
        peer = peer.decode().strip()
        for _ in range(PINGS):
            conn.sendall(conn.recv(1))
        got = conn.recv(CHUNK)
        start, total = time.perf_counter(), len(got)
        stop = start + window
        while got and time.perf_counter() < stop:
            got = conn.recv(CHUNK)
            total += len(got)
        note("in", peer, {"bytes": total, "seconds": time.perf_counter() - start})
    except OSError as err:
        with lock:
            out["errors"].append(f"from a peer: {err}")
    finally:
        conn.close()

def send(peer, ip):
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection((ip, port), timeout=0.5)
        except OSError as err:
            if time.monotonic() > deadline - window:
                with lock:
                    out["errors"].append(f"to {peer} ({ip}:{port}): {err}")
                return
            time.sleep(0.02)
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        conn.sendall(name.encode().ljust(64))
        rtts = []
        for _ in range(PINGS):
            t = time.perf_counter()
            conn.sendall(b"p")
            if not conn.recv(1):
                raise OSError("closed during the round trips")
            rtts.append((time.perf_counter() - t) * 1000)
        note("out", peer, {"rtt_ms": statistics.median(rtts)})
        data = b"\0" * CHUNK
        while time.monotonic() < deadline:
            conn.sendall(data)
    except OSError:
        pass  # the receiver closes once its window is over
    finally:
        conn.close()

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("", port))
except OSError as err:
    print(json.dumps({**out, "errors": [f"port {port} is busy: {err}"]}))
    sys.exit(0)
server.listen(64)
threads = [threading.Thread(target=send, args=(p, ip), daemon=True) for p, ip in peers]
for t in threads:
    t.start()
for _ in range(expect):
    server.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        conn, _ = server.accept()
    except OSError:
        out["errors"].append("a peer never connected")
        break
    t = threading.Thread(target=receive, args=(conn,), daemon=True)
    t.start()
    threads.append(t)
server.close()
for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
with lock:
    print(json.dumps(out))
'''
