"""MPI vs DDP compares data planes, not transports (issue 38): both planes of bench.mpi_vs_ddp go through TCP on
the loopback interface, the page names each row's transport, and the recorded run (MPI through Open MPI's
shared-memory BTL, gloo through TCP) is judged as what it is: its pairs flagged, not counted."""

from __future__ import annotations

import json
from pathlib import Path

from bench import mpi_vs_ddp

# The sitting of 2026-11-24 as docs/benchmarks.json held it before this section was rerun (frozen).
RECORDED = json.loads((Path(__file__).resolve().parent / "fixtures" / "benchmarks-2026-11-24.json").read_text())["mpi_vs_ddp"]


def _mca(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, arg in enumerate(argv) if arg == "--mca"}


def test_both_planes_use_tcp_on_loopback():
    mpirun = mpi_vs_ddp.launchers()["mpi4py"][0]
    assert _mca(mpirun) == {"pml": "ob1", "btl": "self,tcp", "btl_tcp_if_include": "lo"}  # no vader: no shared memory
    assert mpi_vs_ddp._env()["GLOO_SOCKET_IFNAME"] == "lo"
    assert mpi_vs_ddp.TRANSPORTS["mpi4py"][0] == mpi_vs_ddp.TRANSPORTS["gloo-ddp"][0] == "TCP over lo"


def test_a_new_result_is_judged_by_the_one_rule_and_its_rows_name_the_transport():
    result = {**RECORDED["result"], "transports": mpi_vs_ddp.TRANSPORTS}
    [v] = mpi_vs_ddp.judge(result)
    assert v["claim"] == "MPI data plane (TCP over lo) / gloo DDP (TCP over lo) step time (median of pairs)"
    assert v["verdict"] == "met" and v["met_in"] == "3 of 3 pairs" and "flagged" not in v
    table = mpi_vs_ddp.table(result)
    assert "| mpi4py | TCP over lo (pml ob1, btl self,tcp, btl_tcp_if_include lo) |" in table
    assert "| gloo-ddp | TCP over lo (gloo, GLOO_SOCKET_IFNAME=lo) |" in table


def test_the_recorded_run_compared_shared_memory_with_tcp_and_is_not_counted():
    result = RECORDED["result"]
    assert "transports" not in result  # measured with btl self,vader,tcp, before the transports were recorded
    [v] = mpi_vs_ddp.judge(result)
    assert v["claim"] == "MPI data plane (shared memory) / gloo DDP (TCP) step time (median of pairs)"
    assert v["verdict"] == "inconclusive" and not v["met"] and "runs" not in v
    assert [f["why"] for f in v["flagged"]] == ["MPI over shared memory, DDP over TCP: not the same transport"] * 3
    # what that record held, but for the rule's name and the count a side takes (issue 48: the sign test)
    assert {k: x for k, x in v.items() if k not in ("rule", "needed")} == \
        {k: x for k, x in result["verdicts"][0].items() if k != "rule"}
    assert "| mpi4py | shared memory (btl self,vader,tcp: vader between ranks on one host) |" in mpi_vs_ddp.table(result)
