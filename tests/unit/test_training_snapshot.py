"""Snapshots: atomic replacement (a crash at any point leaves the old or the new file, never a torn
one), RNG round trip, and rank 0 handing the state to ranks that have no file."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from training import snapshot


def test_round_trip(tmp_path):
    path = snapshot.save(tmp_path, {"next_epoch": 3, "w": torch.arange(4.0)})
    assert path == tmp_path / snapshot.NAME
    state = snapshot.decode(snapshot.read(tmp_path))
    assert state["next_epoch"] == 3 and torch.equal(state["w"], torch.arange(4.0))
    assert snapshot.read(tmp_path / "missing") is None and snapshot.read(None) is None


def test_crash_between_write_and_rename_keeps_the_previous_snapshot(tmp_path, monkeypatch):
    snapshot.save(tmp_path, {"next_epoch": 3})

    def crash(src, dst):
        raise KeyboardInterrupt("killed between the temporary write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        snapshot.save(tmp_path, {"next_epoch": 4, "big": torch.zeros(100_000)})
    monkeypatch.undo()
    assert len(list(tmp_path.glob(f".{snapshot.NAME}.*.tmp"))) == 1  # the complete-but-unrenamed new one
    assert snapshot.decode(snapshot.read(tmp_path))["next_epoch"] == 3
    snapshot.save(tmp_path, {"next_epoch": 5})
    assert snapshot.decode(snapshot.read(tmp_path))["next_epoch"] == 5
    assert not list(tmp_path.glob(f".{snapshot.NAME}.*.tmp"))  # swept by the next save


def test_torn_temporary_file_is_never_read(tmp_path):
    snapshot.save(tmp_path, {"next_epoch": 2})
    (tmp_path / f".{snapshot.NAME}.999.tmp").write_bytes(b"PK\x03\x04 torn")
    assert snapshot.decode(snapshot.read(tmp_path))["next_epoch"] == 2


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = snapshot.rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    snapshot.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_the_freshest_snapshot_is_broadcast_by_the_rank_that_has_it(tmp_path):
    """Nodes share no disk: rank 1 (say, the old rank 0's node after an elastic restart) holds the newest
    snapshot, rank 0 an older one, rank 2 none; every rank must end with rank 1's."""
    snapshot.save(tmp_path / "r0", {"next_epoch": 4})
    snapshot.save(tmp_path / "r1", {"next_epoch": 6})
    dirs = [tmp_path / "r0", tmp_path / "r1", tmp_path / "r2-missing"]
    epochs = [-1 if snapshot.read(d) is None else snapshot.decode(snapshot.read(d))["next_epoch"] for d in dirs]
    sent = {}

    def broadcast(obj, src):
        if obj is not None:
            sent[src] = obj
        return sent[src] if src in sent else snapshot.read(dirs[src])

    states = [snapshot.load_everywhere(d, r, lambda _mine: epochs, broadcast) for r, d in enumerate(dirs)]
    assert [s["next_epoch"] for s in states] == [6, 6, 6]
    assert list(sent) == [1]


def test_no_snapshot_anywhere_is_a_fresh_start(tmp_path):
    assert snapshot.load_everywhere(tmp_path / "none", 0, lambda mine: [mine], lambda obj, src: obj) is None
    snapshot.save(tmp_path / "one", {"next_epoch": 3})
    assert snapshot.load_everywhere(tmp_path / "one", 0, lambda mine: [mine], lambda obj, src: obj)["next_epoch"] == 3
