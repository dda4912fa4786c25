"""make netcheck's pure parts: the tournament of pairs, iperf3's JSON (recorded from iperf3 3.12 on local
nodes: tests/unit/fixtures/iperf3), what the links allow, the tables."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from multinode.app import netcheck
from multinode.checks import iperf

FIXTURES = Path(__file__).parent / "fixtures" / "iperf3"


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_rounds_cover_every_pair_once_with_disjoint_pairs(n):
    names = [f"node-{i}" for i in range(n)]
    rounds = iperf.rounds(names)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [frozenset(p) for r in rounds for p in r]
    assert sorted(seen, key=sorted) == sorted({frozenset(p) for p in itertools.combinations(names, 2)}, key=sorted)
    assert all(len({x for p in r for x in p}) == 2 * len(r) for r in rounds)  # nobody twice in one round


def test_iperf3_json_gives_the_received_rate_and_the_mean_rtt():
    mbit, rtt, error = iperf.parse_test((FIXTURES / "client_2_flows.json").read_text())
    assert error is None and mbit == pytest.approx(3255.17397, rel=1e-6) and rtt == pytest.approx((3175 + 2771) / 2 / 1000)
    # iperf3 -J exits 0 when the server is not listening: the JSON's error is what tells (and what the retry reads).
    assert iperf.parse_test((FIXTURES / "client_refused.json").read_text()) == \
        (None, None, "unable to connect to server: Connection refused")
    assert iperf.parse_test("bash: iperf3: command not found")[2] == "bash: iperf3: command not found"


def test_the_client_retries_on_the_json_error_and_prints_one_line_per_test():
    text = iperf.client_command("run-1", "10.0.0.2")
    assert text.count("iperf3 -c 10.0.0.2 -p 5201 -t 1") == len(iperf.tests()) == 4
    assert text.count(" -R") == 2 and "*'\"error\"'*) sleep 0.1" in text and "MULTINODE_RUN_ID=run-1" in text


def _pair(src, dst, flows, mbit, rtt=None):
    return iperf.Measured(src, dst, flows, mbit, rtt)


def test_the_link_limit_is_the_slowest_pairs_best_figure():
    pairs = [_pair("a", "b", 1, 8000), _pair("a", "b", 4, 9600), _pair("b", "a", 1, 4000), _pair("b", "a", 4, None)]
    assert netcheck.link_limit(pairs) == 0.5  # b -> a: 4000 Mbit/s = 0.5 GB/s
    assert netcheck.link_limit([]) is None


def test_tables_show_the_matrix_and_busbw_against_the_link():
    pairs = [_pair("node-0", "node-1", 1, 8000, 0.25), _pair("node-0", "node-1", 4, 9600, 0.35),
             _pair("node-1", "node-0", 1, 8000), _pair("node-1", "node-0", 4, None)]
    rows = [{"backend": "gloo", "ranks": 2, "bytes": 1 << 20, "time_s": 0.002, "algbw_gbs": 0.5, "busbw_gbs": 0.5}]
    result = {"nodes": ["node-0", "node-1"], "pairs": [p.__dict__ | {"error": "refused" if p.mbit_s is None else None}
                                                        for p in pairs], "allreduce": rows, "link_limit_gbs": 1.0}
    text = netcheck.tables(result)
    assert "| node-0 |  | 8.00 / 9.60 (0.30 ms) |" in text
    assert "| node-1 | 8.00 / x (0.30 ms) |  |" in text and "- node-1 -> node-0 (4 flows): refused" in text
    assert "| 1 MiB | 2.000 | 0.500 | 0.500 | 0.50 |" in text
