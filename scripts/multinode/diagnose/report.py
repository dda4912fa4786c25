"""How captured stacks are shown and kept: ``multinode stacks`` and ``runs/<id>/stacks/``. Pure but for :func:`save`.

* :func:`group_stacks` prints identical main-thread stacks once, with the ranks (and nodes) that share them,
  after a first line naming the collectives when the ranks wait in different ones.
* :func:`describe_node` is a readable dump of one node: every rank, every sample, every thread's stack.
* :func:`save` writes ``node-i.json`` (the raw capture) and ``node-i.txt`` (readable) per node, and
  ``stacks.txt`` (grouped).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from multinode.diagnose.collectives import mismatch
from multinode.diagnose.dumps import Frame, RankDump, Sample

STATE_WORDS = {"R": "running", "S": "sleeping", "D": "uninterruptible", "T": "stopped", "t": "stopped (traced)",
               "Z": "zombie"}


def stack_lines(sample: Sample) -> list[str]:
    if sample.error:
        return [f"(no stack: {sample.error})"]
    if not sample.frames:  # what py-spy returned, for a look that finds no stack in a live rank
        return [f"(no Python frames: py-spy listed {sample.threads} Python thread{'s' if sample.threads != 1 else ''})"]
    return [f.describe() for f in sample.frames]


def group_stacks(dumps: Iterable[RankDump]) -> str:
    """Identical main-thread stacks printed once, with the ranks (and nodes) that share them; first, when the
    ranks wait in different collectives, which ranks wait in which."""
    dumps = list(dumps)
    groups: dict[tuple[str, ...], list[RankDump]] = {}
    for dump in dumps:
        if dump.last.state is None:
            continue
        groups.setdefault(tuple(stack_lines(dump.last)), []).append(dump)
    found = mismatch(dumps)
    lines = [f"different collectives: {found.describe()}"] if found else []
    for stack, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0].rank)):
        who = ", ".join(f"{d.rank} on {d.node}{' (child)' if d.parent_is_rank else ''}" for d in members)
        states = ", ".join(sorted({STATE_WORDS.get(d.last.state, d.last.state) for d in members}))
        lines.append(f"{len(members)} rank{'s' if len(members) > 1 else ''} ({who}), {states}:")
        lines.extend(f"    {line}" for line in stack)
    return "\n".join(lines) if lines else "no live rank found"


def describe_node(dumps: list[RankDump]) -> str:
    """A readable dump of one node: every rank, every sample, every thread's stack."""
    lines = []
    for dump in dumps:
        lines.append(f"rank {dump.rank} pid {dump.pid}{' (child of a rank)' if dump.parent_is_rank else ''}:")
        for i, raw in enumerate(dump.raw.get("samples", [])):
            if raw is None:
                lines.append(f"  sample {i + 1}: gone")
                continue
            lines.append(f"  sample {i + 1}: state {raw['state']} ({STATE_WORDS.get(raw['state'], '?')}), "
                         f"cpu {raw.get('cpu_ticks', 0)} ticks{': ' + raw['error'] if raw.get('error') else ''}")
            for thread in raw.get("threads", []):
                lines.append(f"    thread {thread['name']}{' (active)' if thread.get('active') else ''}:")
                lines.extend(f"      {Frame(f['name'], f['file'], f['line'], f.get('code', '')).describe()}"
                             for f in thread["frames"])
    return "\n".join(lines) if lines else "no live rank of the run on this node"


def save(directory: Path, per_node: dict[str, list[RankDump]], errors: dict[str, str]) -> Path:
    """Write ``node-i.json`` (raw) and ``node-i.txt`` (readable) per node, and ``stacks.txt`` (grouped)."""
    directory.mkdir(parents=True, exist_ok=True)
    for node, dumps in per_node.items():
        (directory / f"{node}.json").write_text(json.dumps([d.raw for d in dumps], indent=1))
        (directory / f"{node}.txt").write_text(describe_node(dumps) + "\n")
    for node, why in errors.items():
        (directory / f"{node}.txt").write_text(f"no capture: {why}\n")
    every = [d for dumps in per_node.values() for d in dumps]
    (directory / "stacks.txt").write_text(group_stacks(every) + "\n")
    return directory


__all__ = ["STATE_WORDS", "describe_node", "group_stacks", "save", "stack_lines"]
