"""Snapshots: everything needed to resume exactly, written atomically by global rank 0 only.

A snapshot holds the model, optimizer, scheduler and grad-scaler states, the NEXT epoch to run
and the RNG states (torch, numpy, python). It is written to a temporary file in the same
directory, fsynced, renamed over the previous snapshot and the directory fsynced: a crash at any
point leaves either the old or the new snapshot, never a torn one.

On resume, every rank looks at its own disk and the freshest snapshot (highest next epoch; the lowest
rank on a tie) is broadcast by the rank that holds it: nodes share no filesystem, so most ranks have
no file at all, and after an elastic restart global rank 0 may sit on a node other than the one
that wrote the snapshot.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME = "snapshot.pt"


def rng_state() -> dict[str, Any]:
    """Every random stream a resumed run continues (the data order itself is a function of seed and
    epoch through DistributedSampler, so it needs no state of its own)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's generator
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(directory: str | Path, state: dict[str, Any], before_rename=None) -> Path:
    """Write ``state`` atomically as ``<directory>/snapshot.pt`` (``before_rename()``: a drill's fault)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / NAME
    tmp = directory / f".{NAME}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for stale in directory.glob(f".{NAME}.*.tmp"):  # left by a writer killed mid-write
        stale.unlink(missing_ok=True)
    return path


def read(directory: str | Path | None) -> bytes | None:
    if directory is None:
        return None
    path = Path(directory) / NAME
    return path.read_bytes() if path.exists() else None


def decode(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), weights_only=False)


def load_everywhere(directory: str | Path | None, rank: int, gather, broadcast) -> dict[str, Any] | None:
    """The freshest snapshot any rank has, on every rank.

    ``gather(obj) -> [obj of rank 0, obj of rank 1, ...]`` (an all-gather) and
    ``broadcast(obj, src) -> obj`` are the process group's collectives (identity for one process).
    """
    blob = read(directory)
    mine = -1 if blob is None else int(decode(blob)["next_epoch"])
    epochs = gather(mine)
    best = max(epochs)
    if best < 0:
        return None
    src = epochs.index(best)
    blob = broadcast(blob if rank == src else None, src)
    return decode(blob)
