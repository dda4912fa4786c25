"""The order the suite's modules start in: on xdist workers that take whole modules in collection order
(pyproject's addopts), the modules that take longest start first, so no long one is left for the end while the
other workers idle (longest-first scheduling). The list is measured, not guessed: every module that took 45 s or
more in the suite's cold runs on this 2-core machine (`MULTINODE_CPU_REPORT=<file> make test`, then
`python -m cpuaccount <file>`), longest first. Modules not named keep their collection order after them; a new
long module left out starts late and ends the suite late (test_survivors_local did, by 6 minutes, until 2026-12-07)."""

from __future__ import annotations

import cpuaccount

FIRST = (  # by their time in the suite's cold runs of 2026-12-07 (tests/cpuaccount.py's report, this machine)
    "test_spotday_quick.py",  # four methods on 4 nodes, one after the other: 9.4 min
    "test_survivors_local.py",  # nine drills on 3 nodes: 8.2 min (it started last, at 30 min, and ended the suite)
    "test_bench_quick.py",
    "test_drills.py",
    "test_replace_delay_local.py",  # waits out a 60 s replacement, twice (MULTINODE_REPLACE_DELAY): mostly asleep, so
    # after the first CPU-bound modules rather than beside the other two long ones
    "test_slurm_local.py",
    "test_images.py",
    "test_preempt_local.py",
    "test_aws_replace.py",
    "test_recover_local.py",
    "test_training.py",
    "test_culprit_local.py",
    "test_aws_zones.py",
    "test_aws_capacity.py",
    "test_aws_moto.py",
    "test_notice_batch_local.py",
    "test_linkcheck.py",
    "test_slow_rank_local.py",
    "test_gpucheck_local.py",
    "test_survivor_local.py",
    "test_train_local.py",
    "test_ledger_local.py",
    "test_grace_local.py",
    "test_aws_cleanup.py",
    "test_aws_lost_answer.py",
    "test_run_attempts.py",
    "test_stall_culprit.py",
    "test_bootstrap_runtime.py",
    "test_checkpoint_bucket_local.py",
    "test_mpi_contract.py",
    "test_growback_local.py",
    "test_aws_host_runtime.py",
    "test_project_local.py",
    "test_container_owner.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the rest keep their order


def pytest_configure(config) -> None:
    cpuaccount.pytest_configure(config)  # the CPU each test costs, with MULTINODE_CPU_REPORT=<file>
