"""The program every node runs for the link check (:mod:`multinode.checks.links`): stdlib Python only, so it
runs with the inventory's interpreter on the host, whatever runtime the job uses (containers share the host's
network).

    <python> -S -I -c "$PROBE" <name> <port> <window_s> <expected_incoming> <peer>=<ip>,...

It listens on ``port``, connects to each peer's, and on every connection measures:

* **round trip**: a few one-byte ping-pongs before any bulk data (the sender's figure);
* **bandwidth**: the receiver counts the bytes that arrive during ``window_s`` from the first bulk byte, then
  closes -- a throttled link cannot stretch the check with the megabytes a sender's socket buffer holds.

* **the CPU it had**: each measuring thread reads the scheduler's account of itself before and after
  (``/proc/thread-self/schedstat``: "time spent on the cpu" and "time spent waiting on a runqueue", in ns, the
  kernel's Documentation/scheduler/sched-stats.rst); a thread that waited for a CPU most of its time measured the
  CPU, not the link (:mod:`multinode.checks.links` judges it). A CFS quota's throttled time counts as waiting.

It prints one line per figure, then ``end`` (a probe that died before it printed no ``end``; see :func:`parse_lines`)::

    in <peer> <bytes> <seconds> <run_s> <wait_s>     (the receiver's window; run/wait -1: no account kept)
    out <peer> <rtt_ms>
    sent <peer> <seconds> <run_s> <wait_s>           (the sender's bulk data, until the receiver closed)
    error <text>

The receiver closes first, so the end states of the connections stay on the senders' ephemeral ports.

Every node starts it at once, on every node of the cluster: its start is the check's cost. It imports only
built-in modules (``_socket``, ``_thread``: no ``socket``, ``threading``, ``json`` or ``statistics``, whose imports
cost three times the interpreter's own start) and runs without ``site`` (``-S -I``); measured on the 2-core
host of docs/benchmarks.md, 11 ms of CPU per start against 35 ms with those imports and ``site``, and 170 ms
through a pyenv shim (the ``python3`` on PATH there).
"""

from __future__ import annotations

PROBE = r'''
import _socket, _thread, sys, time
name, port, window, expect = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
peers = [p.split("=", 1) for p in sys.argv[5].split(",") if p]
PINGS, CHUNK = 3, 1 << 18
deadline = time.monotonic() + window + 1.5
lines, lock = [], _thread.allocate_lock()

def cpu():
    """This thread's (seconds on a CPU, seconds runnable but waiting for one) so far, from the scheduler's own
    accounting (/proc/thread-self/schedstat: run and run-queue wait in ns); (-1, -1) where the kernel keeps none."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return -1.0, -1.0

def spent(before):
    after = cpu()
    return [-1.0, -1.0] if before[0] < 0 or after[0] < 0 else [round(a - b, 4) for a, b in zip(after, before)]

def say(*fields):
    with lock:
        lines.append(" ".join(str(f) for f in fields).replace("\n", " "))

def tcp(ip):
    return _socket.socket(_socket.AF_INET6 if ":" in ip else _socket.AF_INET, _socket.SOCK_STREAM)

def receive(conn, done):
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
        start, total, used = time.perf_counter(), len(got), cpu()
        stop = start + window
        while got and time.perf_counter() < stop:
            got = conn.recv(CHUNK)
            total += len(got)
        say("in", peer, total, time.perf_counter() - start, *spent(used))
    except OSError as err:
        say("error", f"from a peer: {err}")
    finally:
        conn.close()
        done.release()

def send(peer, ip, done):
    conn = None
    try:
        while conn is None:
            conn = tcp(ip)
            conn.settimeout(0.5)
            try:
                conn.connect((ip, port))
            except OSError as err:
                conn.close()
                conn = None
                if time.monotonic() > deadline - window:
                    say("error", f"to {peer} ({ip}:{port}): {err}")
                    return
                time.sleep(0.02)
        conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        conn.sendall(name.encode().ljust(64))
        rtts = []
        for _ in range(PINGS):
            t = time.perf_counter()
            conn.sendall(b"p")
            if not conn.recv(1):
                raise OSError("closed during the round trips")
            rtts.append((time.perf_counter() - t) * 1000)
        say("out", peer, sorted(rtts)[PINGS // 2])
        data, used, start = b"\0" * CHUNK, cpu(), time.perf_counter()
        try:
            while time.monotonic() < deadline:
                conn.sendall(data)
        except OSError:
            pass  # the receiver closes once its window is over
        say("sent", peer, time.perf_counter() - start, *spent(used))
    except OSError:
        pass  # closed before or during the round trips: the receiver's side says what it got
    finally:
        if conn is not None:
            conn.close()
        done.release()

def start(fn, *args):
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(fn, (*args, done))
    return done

server = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
server.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
try:
    server.bind(("", port))
except OSError as err:
    print(f"error port {port} is busy: {err}\nend")
    sys.exit(0)
server.listen(64)
running = [start(send, p, ip) for p, ip in peers]
for _ in range(expect):
    server.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        fd, _ = server._accept()
    except OSError:
        say("error", "a peer never connected")
        break
    running.append(start(receive, _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)))
server.close()
for done in running:
    done.acquire(True, max(0.0, deadline - time.monotonic()))
with lock:
    print("\n".join(lines + ["end"]), flush=True)
'''


def parse_lines(text: str) -> dict | None:
    """One probe's output as {"in": {peer: {"bytes", "seconds"}}, "out": {peer: {"rtt_ms"}}, "errors": [...]},
    or None when it printed no ``end`` (it did not run, or died); lines of other output are ignored."""
    report: dict = {"in": {}, "out": {}, "sent": {}, "errors": []}
    ended = False
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = rest.split()
        try:
            if kind == "in" and len(fields) in (3, 5):
                report["in"][fields[0]] = {"bytes": int(fields[1]), "seconds": float(fields[2]), **_cpu(fields[3:])}
            elif kind == "out" and len(fields) == 2:
                report["out"][fields[0]] = {"rtt_ms": float(fields[1])}
            elif kind == "sent" and len(fields) == 4:
                report["sent"][fields[0]] = {"seconds": float(fields[1]), **_cpu(fields[2:])}
            elif kind == "error":
                report["errors"].append(rest)
            elif line == "end":
                ended = True
        except ValueError:
            continue
    return report if ended else None


def _cpu(fields: list[str]) -> dict:
    """{"run": s, "wait": s} from a line's two CPU fields (-1: the kernel keeps no account), {} without them."""
    return {"run": float(fields[0]), "wait": float(fields[1])} if len(fields) == 2 else {}
