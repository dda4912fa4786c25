"""The order the suite's modules start in: on xdist workers that take whole modules in collection order
(pyproject's addopts), the modules that take longest start first, so no long one is left for the end while the
other workers idle (longest-first scheduling). The list is measured, not guessed: the slowest modules of the
suite's runs on this 2-core machine (`pytest --durations`), the long waits first (a 120 s replacement delay, the
SLURM daemons, the drills' timeouts, the image builds). Modules not named keep their collection order after them."""

from __future__ import annotations

import cpuaccount

FIRST = (  # by their time in the suite's runs of 2026-11-26 (pytest --durations, this machine)
    "test_spotday_quick.py",  # four methods on 4 nodes, one after the other: 8 min alone (2026-11-27), more in the suite
    "test_replace_delay_local.py",  # waits out a 120 s replacement, twice (MULTINODE_REPLACE_DELAY)
    "test_bench_quick.py",
    "test_drills.py",
    "test_slurm_local.py",
    "test_aws_capacity.py",
    "test_preempt_local.py",
    "test_recover_local.py",
    "test_images.py",
    "test_culprit_local.py",
    "test_slow_rank_local.py",
    "test_notice_batch_local.py",
    "test_aws_replace.py",
    "test_training.py",
    "test_aws_moto.py",
    "test_linkcheck.py",
    "test_survivor_local.py",
    "test_gpucheck_local.py",
    "test_run_attempts.py",
    "test_container_owner.py",
    "test_mpi_contract.py",
    "test_ledger_local.py",
    "test_checkpoint_bucket_local.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order


def pytest_configure(config) -> None:
    cpuaccount.pytest_configure(config)  # the CPU each test costs, with MULTINODE_CPU_REPORT=<file>
