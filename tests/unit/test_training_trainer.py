"""The Trainer in one process (no process group, no sockets): it learns, stops early, and resumes."""

from __future__ import annotations

import json

import pytest
import torch

from training import train
from training.config import load
from training.dist_env import Launch, World
from training.trainer import StoppedAfterEpoch, Trainer
from training.workloads import build


def run(argv: list[str]) -> tuple[Trainer, dict]:
    cfg = load(argv)
    train.seed_everything(cfg.training.seed)
    trainer = Trainer(cfg, World(Launch("single"), None), build(cfg.training), torch.device("cpu"), "ddp")
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


def test_regression_learns_and_writes_metrics(tmp_path):
    _, result = run(["--workload", "regression", "3", "3", "--metrics-dir", str(tmp_path), "--grad-accum", "2"])
    assert result["epochs_run"] == 3 and result["loss_reduction"] >= 10
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in rows] == [0, 1, 2, None] and rows[-1]["event"] == "test"
    assert {"loss", "val_loss", "samples_per_s", "step_time_s", "comm_time_s"} <= rows[0].keys()
    assert (tmp_path / "heartbeat-rank0").exists()  # the step heartbeat the stall watchdog reads


def test_early_stopping_ends_a_diverging_run(tmp_path):
    # lr 10 on a linear regression diverges: the validation loss never improves after epoch 1.
    _, result = run(["--workload", "regression", "20", "100", "--lr", "10", "--patience", "2",
                     "--snapshot-dir", str(tmp_path)])
    assert result["epochs_run"] == 3
    assert torch.load(tmp_path / "snapshot.pt", weights_only=False)["next_epoch"] == 3


def test_resume_continues_at_the_next_epoch_and_ends_equal(tmp_path):
    full, _ = run(["--workload", "regression", "4", "2"])
    with pytest.raises(StoppedAfterEpoch):  # the first half, saved after epoch 2 (index 1)
        run(["--workload", "regression", "4", "3", "--snapshot-dir", str(tmp_path), "--stop-after-epoch", "1"])
    resumed, result = run(["--workload", "regression", "4", "2", "--snapshot-dir", str(tmp_path)])
    assert result["epochs_run"] == 2
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_main_exits_3_after_a_requested_stop_and_resumes(tmp_path, monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    args = ["--workload", "regression", "3", "10", "--snapshot-dir", str(tmp_path)]
    assert train.main([*args, "--stop-after-epoch", "0"]) == 3
    assert "RESULT" not in capsys.readouterr().out
    assert train.main(args) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")][-1]
    assert json.loads(line[len("RESULT "):])["epochs_run"] == 2


def test_a_new_rank_builds_its_trainer_before_it_says_it_is_ready(tmp_path, monkeypatch):
    """The running ranks pause when the run opens the generation that takes a new rank in, which it does once the new
    rank said JOINING (membership.join): what the new rank builds after that, they wait for. Its optimizer among them
    (the first one imports torch._dynamo: 1.3-2.6 s of grow-back pause, measured, when it was built after)."""
    from training import membership

    built = {}

    def join(host, timeout):
        built.update({name: hasattr(host, name) for name in ("model", "optimizer", "scheduler", "scaler", "plan")})
        return 0, 0

    monkeypatch.setattr(membership, "join", join)
    cfg = load(["--workload", "regression", "1", "1", "--metrics-dir", str(tmp_path)])
    world = World(Launch("single"), None, joining="its place")
    Trainer(cfg, world, build(cfg.training), torch.device("cpu"), "ddp").close()
    assert built == {"model": True, "optimizer": True, "scheduler": True, "scaler": True, "plan": True}


def test_a_rank_whose_collective_failed_tells_it_from_a_failure_of_its_own():
    """A rank exits channel.EXIT_PEER_FAILED (76) when its error comes of a failed collective -- gloo's own words, or
    the survivors' fallback raised from one (the reform timeout: its RuntimeError, from NoNewMembership, raised while
    handling the Change the collective's error caused) -- and as before for anything else."""
    from training import membership, reform
    from training.survivor import peer_failed

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.11]")
    assert peer_failed(gloo) and not peer_failed(ValueError("a bad batch")) and not peer_failed(KeyError("x"))
    try:
        try:
            try:
                raise reform.lost(gloo, (3, 64), None) from gloo
            except reform.Change:
                raise membership.NoNewMembership("no membership newer than generation 0 within 60 s")
        except membership.NoNewMembership as err:
            raise RuntimeError(f"{err}: the restart path takes over") from err
    except RuntimeError as fallback:
        assert peer_failed(fallback)
    try:
        try:
            raise gloo
        except RuntimeError:
            raise ValueError("a user's handler failed while the collective's error was handled")
    except ValueError as handled:
        assert peer_failed(handled)  # the collective's failure came first: what the user's code met
