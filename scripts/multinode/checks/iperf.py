"""Node-to-node bandwidth and round trip with iperf3 (``make netcheck``'s matrix): every ordered pair, with one
TCP flow and with several, scheduled as a round-robin tournament so each round measures disjoint pairs at once
(N-1 rounds instead of N(N-1)/2 one after another).

iperf3's JSON (``-J``): ``end.sum_received.bits_per_second`` is what the receiving side got, and
``end.streams[i].sender.mean_rtt`` the kernel's smoothed TCP round trip in microseconds (Linux only; iperf3's
``iperf_api.c``, ``mean_rtt``), both in every release since 3.1. ``-R`` reverses the direction, so one server
on each pair's second node serves all four tests (``-1``: one test, then exit).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from multinode.core.inventory import Inventory
from multinode.ssh.runner import RemoteRunner

PORT = 5201  # iperf3's own default port
FLOWS = (1, 4)
SECONDS = 1


@dataclass(frozen=True)
class Measured:
    src: str
    dst: str
    flows: int
    mbit_s: float | None
    rtt_ms: float | None
    error: str | None = None


def rounds(names: list[str]) -> list[list[tuple[str, str]]]:
    """The circle method: N-1 rounds (N even; a bye per round when odd) of disjoint pairs covering every pair once."""
    ring = list(names) + ([None] if len(names) % 2 else [])
    out = []
    for _ in range(len(ring) - 1):
        pairs = [(ring[i], ring[-1 - i]) for i in range(len(ring) // 2)]
        out.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


def tests() -> list[tuple[int, bool]]:
    """(flows, reverse) of each test a pair runs: each flow count, forward then reverse."""
    return [(flows, reverse) for reverse in (False, True) for flows in FLOWS]


def server_command(run_id: str, bind: str) -> str:
    one = f"timeout {SECONDS * 4 + 20} iperf3 -s -1 -p {PORT} -B {shlex.quote(bind)} >/dev/null 2>&1"
    return f"export MULTINODE_RUN_ID={shlex.quote(run_id)}; for k in {' '.join(['x'] * len(tests()))}; do {one}; done"


def client_command(run_id: str, server_ip: str) -> str:
    """Every test against the pair's server, each retried while that server restarts; one JSON per line."""
    lines = [f"export MULTINODE_RUN_ID={shlex.quote(run_id)}"]
    for flows, reverse in tests():
        argv = f"iperf3 -c {shlex.quote(server_ip)} -p {PORT} -t {SECONDS} -P {flows} -J{' -R' if reverse else ''}"
        # iperf3 -J exits 0 with {"error": ...} when the server is not listening yet: retry on the JSON's error.
        lines.append(f"for i in $(seq 100); do out=$({argv} 2>&1); case $out in *'\"error\"'*) sleep 0.1;; *) break;; esac; "
                     "done; echo \"$out\" | tr -d '\\n'; echo")
    return "\n".join(lines)


def parse_test(text: str) -> tuple[float | None, float | None, str | None]:
    """(Mbit/s received, mean round trip ms, error) from one test's JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None, None, (text.strip()[-200:] or "no output")
    if "error" in data:
        return None, None, str(data["error"])
    end = data.get("end", {})
    bps = end.get("sum_received", {}).get("bits_per_second")
    rtts = [s["sender"]["mean_rtt"] for s in end.get("streams", []) if "mean_rtt" in s.get("sender", {})]
    return (bps / 1e6 if bps else None), (sum(rtts) / len(rtts) / 1000 if rtts else None), None


def missing(runner: RemoteRunner) -> dict[str, str]:
    """Nodes without iperf3: {node: what the shell said}."""
    found = runner.run_all("command -v iperf3")
    return {name: (res.stderr or res.error or "not on PATH").strip() for name, res in found.items() if not res.ok}


def matrix(runner: RemoteRunner, inv: Inventory, run_id: str) -> list[Measured]:
    """Every ordered pair x each flow count, measured round by round (disjoint pairs at once); each node's
    server and client are tagged with ``run_id`` for the sweep."""
    out: list[Measured] = []
    for pairs in rounds([n.name for n in inv.nodes]):
        commands: dict[str, str] = {}
        for a, b in pairs:
            commands[b] = server_command(run_id, inv.node(b).private_ip)
            commands[a] = client_command(run_id, inv.node(b).private_ip)
        results = runner.run_each(commands, timeout=len(tests()) * (SECONDS + 15) + 10)
        for a, b in pairs:
            res = results[a]
            lines = res.stdout.splitlines() if res.exit_code is not None else []
            for i, (flows, reverse) in enumerate(tests()):
                src, dst = (b, a) if reverse else (a, b)
                if i < len(lines):
                    mbit, rtt, error = parse_test(lines[i])
                else:
                    mbit, rtt, error = None, None, res.error or res.stderr.strip()[-200:] or "no answer"
                out.append(Measured(src, dst, flows, mbit, None if reverse else rtt, error))  # the receiver knows no RTT
    return out
