"""Which collective each live rank waits in, and whether they differ. Pure.

A job whose ranks call different collectives (rank 0 ``all_reduce``, ranks 1-2 ``broadcast``: a branch on the
rank, a skipped step) hangs with every rank "waiting on its peers", so :mod:`multinode.diagnose.rank`'s
verdicts clear them all. The stacks say more: :func:`collective_of` names the collective on a rank's stack
(the outermost ``torch.distributed`` collective frame -- the call the program made, e.g.
``broadcast_object_list`` rather than the ``broadcast`` inside it -- or an mpi4py call on the program's own
line), and :func:`mismatch` groups the ranks by it: when every live rank waits in a named collective, in
the same one at every look, and they are not all the same, it names the groups and the odd one out (the
smallest group, when one group is smaller than every other).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from multinode.diagnose.dumps import Frame, RankDump

# torch.distributed's collectives and point-to-point calls, by their function's name in distributed_c10d.py.
TORCH_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "broadcast", "broadcast_object_list", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "gather", "gather_object", "scatter", "scatter_object_list",
    "send", "recv", "send_object_list", "recv_object_list",
})
TORCH_FILE = re.compile(r"torch/distributed/distributed_c10d\.py$")
# mpi4py's calls show as the program's own line (the C call has no Python frame).
MPI_CALL = re.compile(r"\.(Allreduce|allreduce|Iallreduce|Bcast|bcast|Barrier|barrier|Allgather|allgather|Reduce_scatter|"
                      r"Alltoall|alltoall|Reduce|reduce|Gather|gather|Scatter|scatter|Send|send|Recv|recv|Sendrecv)\s*\(")


def collective_of(frames: Iterable[Frame]) -> str | None:
    """The collective this stack waits in (innermost first), or None when it is in none."""
    frames = list(frames)
    named = [f.name for f in frames if f.name in TORCH_COLLECTIVES and TORCH_FILE.search(f.file)]
    if named:
        return named[-1]
    for f in frames:
        match = MPI_CALL.search(f.code)
        if match:
            return f"MPI {match[1]}"
    return None


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 0``, ``ranks 1-2``, ``ranks 0, 3-5``."""
    ranks = sorted(set(ranks))
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


@dataclass(frozen=True)
class Mismatch:
    groups: dict[str, tuple[RankDump, ...]]  # collective -> the ranks waiting in it, largest group last
    odd: tuple[RankDump, ...] | None  # the smallest group, when it is smaller than every other

    def describe(self) -> str:
        """``rank 0 in all_reduce, ranks 1-2 in broadcast: the ranks called different collectives``."""
        parts = [f"{rank_list(d.rank for d in dumps)} in {name}" for name, dumps in self.groups.items()]
        return ", ".join(parts) + ": the ranks called different collectives"


def mismatch(dumps: Iterable[RankDump]) -> Mismatch | None:
    """The ranks grouped by the collective they wait in, when every live rank waits in one (the same at every
    look) and they differ; None otherwise (a rank outside any collective, or all in the same one)."""
    groups: dict[str, list[RankDump]] = {}
    for dump in dumps:
        alive = [s for s in dump.samples if s.state is not None]
        if dump.parent_is_rank or not alive:
            continue  # a rank's child, or gone: not a participant
        names = {collective_of(s.frames) for s in alive}
        if len(names) != 1 or None in names:
            return None
        groups.setdefault(names.pop(), []).append(dump)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), min(d.rank for d in item[1])))
    sizes = [len(members) for _, members in ordered]
    odd = tuple(sorted(ordered[0][1], key=lambda d: d.rank)) if sizes[0] < sizes[1] else None
    return Mismatch({name: tuple(sorted(members, key=lambda d: d.rank)) for name, members in ordered}, odd)


__all__ = ["Mismatch", "collective_of", "mismatch", "rank_list"]
