"""Snapshots: everything needed to resume exactly, written atomically by global rank 0 only.

A snapshot holds the model, optimizer, scheduler and grad-scaler states, the NEXT epoch to run
and the RNG states (torch, numpy, python). It is written to a temporary file in the same
directory, fsynced, renamed over the previous snapshot and the directory fsynced: a crash at any
point leaves either the old or the new snapshot, never a torn one.

Every copy has a checksum beside it (``snapshot.sha256``: sha256 and size of ``snapshot.pt``, written
atomically after it): a copy whose bytes do not match is not complete and is never loaded (a copy without
one, from before checksums, is taken as it is). A copy of rank 0's snapshot lives on another node in
``<dir>/replica/`` (:mod:`training.replica` sends it over the process group).

On resume, every rank looks at its own disk (its snapshot and its replica) and the freshest complete
copy (highest next epoch, then the samples of it already trained, ``consumed``; the lowest rank on a tie) is
broadcast by the rank that holds it: nodes share no filesystem, so most ranks have no file at all, and after an elastic restart or the
loss of node-0 global rank 0 may sit on a node other than the one that wrote the snapshot.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME = "snapshot.pt"
SUM = "snapshot.sha256"
REPLICA = "replica"  # the subdirectory holding a copy of another node's snapshot
BATCH_SPAN = 2**32  # freshness = next_epoch * BATCH_SPAN + consumed (or, in snapshots before it, batch)


def rng_state() -> dict[str, Any]:
    """Every random stream a resumed run continues (the data order itself is a function of seed and
    epoch, :mod:`training.sampler`, so it needs no state of its own)."""
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


def _write_atomic(directory: Path, name: str, data: bytes, before_rename=None) -> Path:
    path, tmp = directory / name, directory / f".{name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
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
    return path


def encode(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def write(directory: str | Path, blob: bytes, before_rename=None) -> Path:
    """Write ``blob`` atomically as ``<directory>/snapshot.pt``, then its checksum (``before_rename()``: a
    drill's fault, between the complete temporary file and the rename)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = _write_atomic(directory, NAME, blob, before_rename)
    _write_atomic(directory, SUM, f"{digest(blob)} {len(blob)}\n".encode())
    for stale in directory.glob(".snapshot.*.tmp"):  # left by a writer killed mid-write
        stale.unlink(missing_ok=True)
    return path


def save(directory: str | Path, state: dict[str, Any], before_rename=None) -> Path:
    """Write ``state`` atomically as ``<directory>/snapshot.pt`` with its checksum."""
    return write(directory, encode(state), before_rename)


def read(directory: str | Path | None) -> bytes | None:
    """The complete snapshot in ``directory``: None when there is none or its bytes fail their checksum."""
    if directory is None:
        return None
    path = Path(directory) / NAME
    if not path.exists():
        return None
    blob = path.read_bytes()
    try:
        expected = (Path(directory) / SUM).read_text().split()
    except OSError:
        return blob  # written before checksums existed
    return blob if expected[:2] == [digest(blob), str(len(blob))] else None


def freshness(state: dict[str, Any]) -> int:
    """Later is larger: the next epoch, then the samples of it already trained (a mid-epoch preemption
    snapshot; ``batch``, its count of batches, in snapshots written before ``consumed`` existed)."""
    within = state["consumed"] if "consumed" in state else state.get("batch", 0)
    return int(state["next_epoch"]) * BATCH_SPAN + int(within)


def freshest_copy_here(directory: str | Path | None) -> tuple[int, bytes | None, str | None]:
    """(freshness, blob, path) of the freshest complete copy in ``directory`` or its replica; (-1, None, None)
    if none."""
    best: tuple[int, bytes | None, str | None] = (-1, None, None)
    if directory is None:
        return best
    for place in (Path(directory), Path(directory) / REPLICA):
        blob = read(place)
        if blob is not None:
            key = freshness(decode(blob))
            if key > best[0]:
                best = (key, blob, str(place / NAME))
    return best


def freshest_here(directory: str | Path | None) -> tuple[int, bytes | None]:
    """(freshness, blob) of the freshest complete copy in ``directory`` or its replica; (-1, None) if none."""
    return freshest_copy_here(directory)[:2]


def decode(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), weights_only=False)


def load_everywhere(directory: str | Path | None, rank: int, gather, broadcast) -> dict[str, Any] | None:
    """The freshest snapshot any rank has, on every rank.

    ``gather(obj) -> [obj of rank 0, obj of rank 1, ...]`` (an all-gather) and
    ``broadcast(obj, src) -> obj`` are the process group's collectives (identity for one process).
    """
    mine, blob = freshest_here(directory)
    epochs = gather(mine)
    best = max(epochs)
    if best < 0:
        return None
    src = epochs.index(best)
    blob = broadcast(blob if rank == src else None, src)
    return decode(blob)


@dataclass(frozen=True)
class Loaded:
    """The freshest snapshot, and where it came from."""

    state: dict[str, Any]
    rank: int  # the rank that held it and broadcast it
    host: str
    path: str


def load_freshest(directory: str | Path | None, rank: int, gather, broadcast, remote=None) -> Loaded | None:
    """:func:`load_everywhere`, and where the snapshot came from (the rank, its host and the file). When no rank
    holds one, ``remote() -> (blob, where) | None`` (a bucket's freshest complete copy) is asked on rank 0 and
    broadcast; its ``host`` is then empty and its ``path`` the copy's URL."""
    key, blob, path = freshest_copy_here(directory)
    offers = gather((key, socket.gethostname(), path))
    keys = [offer[0] for offer in offers]
    if max(keys) < 0:
        if remote is None:
            return None
        found = broadcast(remote() if rank == 0 else None, 0)
        return None if found is None else Loaded(decode(found[0]), 0, "", found[1])
    src = keys.index(max(keys))
    blob = broadcast(blob if rank == src else None, src)
    return Loaded(decode(blob), src, offers[src][1], offers[src][2])
