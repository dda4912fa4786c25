"""A second copy of every snapshot, on another node, sent over the job's own process group.

Global rank 0 writes the snapshot; its *buddy* -- the lowest rank whose host differs from rank 0's --
receives the same bytes with ``send``/``recv`` on the process group the job already uses (gloo here; NCCL
moves them through the GPU), checks their sha256 and writes them atomically with their checksum to
``<snapshot dir>/replica/`` on its own node (:func:`training.snapshot.write`). Losing any one node then
leaves a complete copy: node-0's loss leaves the buddy's, the buddy node's loss leaves rank 0's.
:func:`training.snapshot.load_everywhere` resumes from the freshest complete copy on any surviving rank.

Every rank calls :func:`replicate` at the same point (after rank 0 wrote); ranks other than 0 and the
buddy only take part in the final gather that tells rank 0 where the copies are. A job on one host has no
buddy: the snapshot then has one copy, and :func:`replicate` says so.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import snapshot


@dataclass(frozen=True)
class Copies:
    """Where a snapshot is: ``[(rank, host, path), ...]``, rank 0's first."""

    places: list[tuple[int, str, str]]

    def describe(self) -> str:
        return ", ".join(f"{host}:{path} (rank {rank})" for rank, host, path in self.places)


def hosts(gather) -> list[str]:
    """Every rank's host name, by rank (one all-gather, once per job)."""
    return gather(socket.gethostname())


def buddy_of(host_by_rank: list[str]) -> int | None:
    """The lowest rank on another host than rank 0's; None when every rank shares rank 0's host."""
    for rank, host in enumerate(host_by_rank):
        if host != host_by_rank[0]:
            return rank
    return None


def _send(blob: bytes, dst: int, device: torch.device) -> None:
    head = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    payload = bytes.fromhex(snapshot.digest(blob)) + blob
    dist.send(head, dst)
    dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device), dst)


def _recv(device: torch.device) -> bytes:
    head = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(head, 0)
    payload = torch.empty(int(head.item()) + 32, dtype=torch.uint8, device=device)
    dist.recv(payload, 0)
    data = payload.cpu().numpy().tobytes()
    digest, blob = data[:32].hex(), data[32:]
    if snapshot.digest(blob) != digest:
        raise OSError("the snapshot replica arrived with a wrong sha256; it was not written")
    return blob


def replicate(blob: bytes | None, directory: str | Path, rank: int, host_by_rank: list[str], gather,
              device: torch.device) -> Copies:
    """Rank 0 passes the snapshot's bytes (it has written them to ``directory``); the buddy writes its copy
    to ``directory/replica``; every rank returns the same :class:`Copies`."""
    buddy = buddy_of(host_by_rank)
    where = None
    if rank == 0:
        if buddy is not None:
            _send(blob, buddy, device)
        where = str(Path(directory) / snapshot.NAME)
    elif rank == buddy:
        where = str(snapshot.write(Path(directory) / snapshot.REPLICA, _recv(device)))
    everyone = gather(where)
    return Copies([(r, host_by_rank[r], path) for r, path in enumerate(everyone) if path])
