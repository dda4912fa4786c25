"""Failure drills (bench/drills/) as tests: each fault ends the job non-zero, names the node that
caused it, and leaves no process of ours on any node. Timings are reported by `python -m
bench.drills` (docs/reliability.md), never asserted."""

from __future__ import annotations

import pytest

from bench.drills.crashes import DRILLS, PRESTART_DRILLS, SIGNALLED, run_drill, run_prestart_drill
from bench.drills.elastic import ELASTIC_DRILLS, SAVE_EVERY, run_elastic_drill

pytestmark = pytest.mark.integration

ISOLATING = {"cut a node's link mid-training"}  # node-1 cannot be reached to be stopped until it is back
# The elastic drills' runs: the page's ELASTIC_EPOCHS (40) is longer than the claim needs; the faults hit after
# epoch 12 at the latest, and digits meets its 95% in 10 epochs (test_slurm_local.py's DIGITS).
ELASTIC_TEST_EPOCHS = 16


@pytest.mark.parametrize("name", list(DRILLS))
def test_drill(cluster3, name: str):
    result = run_drill(cluster3, name)
    if name in SIGNALLED:
        assert result.exit_code == SIGNALLED[name], result
    else:
        assert result.exit_code == 1, result
        assert result.first_named == "node-1", result
    if name in ISOLATING:  # what it leaves (docs/failures.md): the cut-off node's own ranks, until they time out
        assert {node for node, pids in result.left_at_exit.items() if pids} <= {"node-1"}, result
    else:
        assert not any(result.left_at_exit.values()), result
    assert not any(result.left_after_recovery.values()), result


@pytest.mark.parametrize("name", list(PRESTART_DRILLS))
def test_prestart_drill(cluster3, name: str):
    """A node that cannot be reached, or cannot reach the head (the rendezvous): refused at pre-flight (exit 2)
    in one line naming node-1, nothing started."""
    result = run_prestart_drill(cluster3, name)
    assert result.exit_code == 2, result
    assert result.first_named == "node-1", result
    assert not any(result.left_at_exit.values()), result
    assert not any(result.left_after_recovery.values()), result


@pytest.mark.parametrize("name", list(ELASTIC_DRILLS))
def test_elastic_drill_finishes_from_the_last_snapshot(cluster3, name: str):
    """MAX_RESTARTS=1: the job survives the fault, resumes from its freshest snapshot (losing at most one
    snapshot interval), still meets the accuracy target, and leaves nothing behind."""
    result = run_elastic_drill(cluster3, name, epochs=ELASTIC_TEST_EPOCHS)
    assert result.exit_code == 0, result
    assert result.resumed_from is not None, result
    assert 0 <= result.epochs_lost <= SAVE_EVERY, result
    assert result.test_accuracy is not None and result.test_accuracy >= 0.95, result
    assert not any(result.left_at_exit.values()), result
