"""The knobs the spot day's replay needs (bench.spotday): a pace by the work (``--min-sample-seconds``: on fewer
ranks at the same global batch a step takes longer, as a compute-bound model's would), a trainer without the
surviving ranks' snapshot (``MULTINODE_SURVIVOR=0``: the baselines resume from their last periodic checkpoint, as a
user's trainer does), and a local replacement's delay that changes while a run goes on (each event's own)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from multinode.core.errors import UserError
from multinode.core.state import ClusterState
from multinode.providers.local.faults import replace_delay, set_replace_delay
from training import channel, survivor
from training.config import ConfigError, load


def test_a_step_lasts_at_least_its_samples_times_the_pace_or_the_step_pace():
    t = load(["--workload", "digits", "--min-sample-seconds", "0.005", "10", "5"]).training
    assert t.pace(32) == pytest.approx(0.16) and t.pace(43) == pytest.approx(0.215)  # 4 ranks, then 3, of 128
    both = load(["--min-sample-seconds", "0.005", "--min-step-seconds", "0.2", "10", "5"]).training
    assert both.pace(32) == pytest.approx(0.2) and both.pace(43) == pytest.approx(0.215)
    assert load(["10", "5"]).training.pace(32) == 0.0


@pytest.mark.parametrize("flag", ["--min-sample-seconds", "--min-step-seconds"])
def test_a_negative_pace_is_one_line_naming_it(flag):
    with pytest.raises(ConfigError, match=rf"^{flag[2:]}=-0.1 must be 0 \(no pace\) or more seconds$"):
        load([flag, "-0.1", "10", "5"])


def test_multinode_survivor_0_turns_the_surviving_ranks_snapshot_off(monkeypatch):
    trainer = SimpleNamespace(world=SimpleNamespace(backend="gloo", member=None),
                              t=SimpleNamespace(snapshot_dir="/snap"))
    monkeypatch.delenv(channel.SURVIVOR_ENV, raising=False)
    assert survivor._keeps(trainer)
    monkeypatch.setenv(channel.SURVIVOR_ENV, "0")
    assert not survivor._keeps(trainer)
    monkeypatch.setenv(channel.SURVIVOR_ENV, "1")
    assert survivor._keeps(trainer)


def test_a_replacement_delay_set_while_a_run_goes_on_wins_over_the_environment_until_cleared(tmp_path):
    state = ClusterState.for_cluster("sd", root=tmp_path)
    env = {"MULTINODE_REPLACE_DELAY": "40"}
    assert replace_delay(env, state) == 40.0
    set_replace_delay(state, 137.5)
    assert replace_delay(env, state) == 137.5 and replace_delay(env) == 40.0  # the estimate reads the environment
    set_replace_delay(state, None)
    assert replace_delay(env, state) == 40.0
    with pytest.raises(UserError, match="give 0 or more seconds"):
        set_replace_delay(state, -1)
