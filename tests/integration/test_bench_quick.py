"""The benchmarks run and produce their results (short mode). Numbers are never asserted."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_mpi_vs_ddp_benchmark_runs():
    from bench.mpi_vs_ddp import run, table

    result = run(quick=True)
    assert {"gloo-ddp", "mpi4py", "mpi_over_ddp_step_ratio"} <= result.keys()
    assert "MPI / DDP step-time ratio" in table(result)
