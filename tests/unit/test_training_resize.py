"""The Trainer in one process (no process group, no sockets) across a mid-epoch stop: it resumes at the sample it
stopped at, bitwise; a snapshot written by 3 ranks resumes on 1 with its global batch; every sample id is logged
once per epoch; the heartbeat holds the step count."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from training import snapshot, train
from training.config import load
from training.dist_env import Launch, World
from training.trainer import Preempted, Trainer
from training.workloads import build


class Lines(logging.Handler):
    """The messages it was given, as text."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.text = ""

    def emit(self, record):
        self.text += record.getMessage() + "\n"


@pytest.fixture
def training_log(monkeypatch):
    """The "training" logger's messages at INFO, whatever an earlier test did to logging's configuration."""
    logger = logging.getLogger("training")
    handler, level = Lines(), logger.level
    monkeypatch.setattr(logger, "disabled", False)
    # setLevel, not the attribute: it also clears the loggers' isEnabledFor cache, where a test that ran before in
    # this process (another order under pytest-xdist) may have left INFO disabled.
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


class StopAt:
    """Stands in for the notice agreement: every rank agrees to stop (or, ``decision="save"``, to save for a
    rebalance recommendation and go on) after step ``at`` of this process."""

    def __init__(self, at: int, decision: str = "stop"):
        self.at, self.steps, self.decision = at, 0, decision
        self.rebalance = None  # this rank noticed nothing itself (another rank did)

    def check(self) -> str | None:
        self.steps += 1
        return self.decision if self.steps == self.at else None


def trainer_for(argv: list[str]) -> Trainer:
    cfg = load(argv)
    train.seed_everything(cfg.training.seed)
    return Trainer(cfg, World(Launch("single"), None), build(cfg.training), torch.device("cpu"), "ddp")


def run(argv: list[str], stop_at: int | None = None, decision: str = "stop") -> tuple[Trainer, dict | None]:
    trainer = trainer_for(argv)
    if stop_at is not None:
        trainer.agreement = StopAt(stop_at, decision)
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


ARGS = ["--workload", "regression", "3", "3", "--batch-size", "64"]  # 2868 samples: 45 steps an epoch


def test_a_mid_epoch_stop_resumes_at_its_sample_bitwise(tmp_path, capsys, training_log):
    full, _ = run(ARGS)
    snap = ["--snapshot-dir", str(tmp_path / "snap"), "--metrics-dir", str(tmp_path / "m"), "--log-samples"]
    with pytest.raises(Preempted) as stop:
        run([*ARGS, *snap], stop_at=50)  # epoch 1, step 5 of it
    assert stop.value.report["stopped_at"] == {"epoch": 1, "batch": 5, "step": 50}
    state = snapshot.decode(snapshot.read(tmp_path / "snap"))
    assert (state["next_epoch"], state["consumed"], state["step"]) == (1, 320, 50)
    assert (state["global_batch"], state["world_size"]) == (64, 1)
    capsys.readouterr()
    training_log.text = ""
    resumed, result = run([*ARGS, *snap])
    out = capsys.readouterr().out
    assert "resumed from snapshot: next epoch 1 batch 5 (consumed 320 samples)" in training_log.text
    line = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESUMED "))[len("RESUMED "):])
    assert line == {"epoch": 1, "consumed": 320, "step": 50, "world_size_before": 1, "world_size": 1,
                    "global_batch": 64, "accum": 1, "micro_batch": 64,
                    "snapshot_from": line["snapshot_from"], "survivor": False} and line["snapshot_from"].endswith(
                        "snap/snapshot.pt")
    assert result["epochs_run"] == 2
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    rows = [json.loads(ln) for ln in (tmp_path / "m" / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))  # no step logged twice, none missing
    for epoch in range(3):
        ids = [i for r in rows if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(len(resumed.workload.train))), epoch
    assert (tmp_path / "m" / "heartbeat-rank0").read_text().strip().isdigit()


def test_a_snapshot_of_three_ranks_resumes_on_one_with_its_global_batch(tmp_path, capsys, training_log):
    """What a resize from 3 ranks to 1 looks like: the global batch 3 x 64 stays, one rank takes it as three
    micro-batches of 64, and the rest of the epoch is trained from the sample the 3 ranks stopped at."""
    with pytest.raises(Preempted):
        run([*ARGS, "--snapshot-dir", str(tmp_path)], stop_at=2)
    state = snapshot.decode(snapshot.read(tmp_path))
    state.update(global_batch=192, world_size=3, consumed=384, step=2)  # as 3 ranks would have written it
    snapshot.save(tmp_path, state)
    capsys.readouterr()
    training_log.text = ""
    trainer, result = run([*ARGS, "--snapshot-dir", str(tmp_path), "--metrics-dir", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert "global batch 192 = 1 ranks x 192 samples (3 micro-batches of up to 64)" in training_log.text
    assert "resized: 3 ranks -> 1, the same global batch" in training_log.text
    line = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESUMED "))[len("RESUMED "):])
    assert (line["world_size_before"], line["world_size"], line["accum"], line["micro_batch"]) == (3, 1, 3, 64)
    rows = [json.loads(ln) for ln in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    # 2868 samples: (2866 - 384) / 192 -> 13 steps left in epoch 0, then 15 a whole epoch
    assert [r["steps"] for r in rows[:-1]] == [13, 15, 15] and result["loss_reduction"] >= 10
    assert trainer.step == 2 + 13 + 15 + 15


def test_a_snapshot_from_before_consumed_resumes_at_its_batch(tmp_path, capsys, training_log):
    with pytest.raises(Preempted):
        run([*ARGS, "--snapshot-dir", str(tmp_path)], stop_at=3)
    state = snapshot.decode(snapshot.read(tmp_path))
    for key in ("consumed", "global_batch", "world_size", "step"):
        del state[key]
    state["batch"] = 3
    snapshot.save(tmp_path, state)
    assert snapshot.freshness(state) == 3
    capsys.readouterr()
    training_log.text = ""
    trainer = trainer_for([*ARGS, "--snapshot-dir", str(tmp_path)])
    trainer.close()
    assert (trainer.start_epoch, trainer.start_consumed, trainer.plan.global_batch) == (0, 192, 64)
    assert "resumed from snapshot: next epoch 0 batch 3 (consumed 192 samples)" in training_log.text


def test_a_rebalance_saves_mid_epoch_and_the_run_goes_on_bitwise(tmp_path, training_log):
    """A rebalance recommendation agreed at step 50: one snapshot of that step (mid-epoch, as a preemption's), no
    stop, and the run ends with the weights of a run that had none."""
    full, _ = run(ARGS)
    snap = ["--snapshot-dir", str(tmp_path / "snap")]  # save_every 100: only the last epoch saves
    training_log.text = ""
    saved, result = run([*ARGS[:3], "100", *ARGS[4:], *snap], stop_at=50, decision="save")
    assert result["epochs_run"] == 3
    assert training_log.text.count("one coordinated checkpoint at epoch 1 batch 5 (step 50); the job goes on") == 1
    assert training_log.text.count("snapshot saved:") == 2  # the rebalance's, then the last epoch's
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, saved.model.state_dict()[name]), name
