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


def test_rank_0_reads_and_broadcasts(tmp_path):
    snapshot.save(tmp_path / "rank0", {"next_epoch": 7})
    sent = []

    def broadcast_from_rank0(obj):
        sent.append(obj)
        return obj

    state = snapshot.load_everywhere(tmp_path / "rank0", 0, broadcast_from_rank0)
    assert state["next_epoch"] == 7 and isinstance(sent[0], bytes)
    # Another node: no file of its own (its directory does not even exist); it gets rank 0's bytes.
    received = snapshot.load_everywhere(tmp_path / "node1", 1, lambda obj: sent[0] if obj is None else obj)
    assert received["next_epoch"] == 7
    assert snapshot.load_everywhere(tmp_path / "none", 0, lambda obj: obj) is None
