"""What a recovering run went through, in time order: notice or loss -> checkpoint -> replacement asked -> node
ready -> job started again (:mod:`multinode.app.recover` fills it; saved as ``recovery.json`` and in the summary)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def checkpoint_time(report: dict) -> float | None:
    """When a PREEMPTED report's checkpoint was written (its start + its seconds); None if it does not say."""
    start, seconds = report.get("stopped_time"), report.get("checkpoint_seconds")
    if not isinstance(start, (int, float)) or not isinstance(seconds, (int, float)):
        return None
    return float(start) + float(seconds)


@dataclass
class Timeline:
    """What happened between attempts, in order: ``{"event", "at" (Unix seconds), "detail"}``."""

    events: list[dict] = field(default_factory=list)
    steps_lost: list[int] = field(default_factory=list)  # per recovery, when both ends are known

    def add(self, event: str, detail: str = "", at: float | None = None) -> None:
        """The event at its time among the others (one given ``at`` after the fact, such as a job's start known
        only once its attempt ended, goes before what happened later)."""
        entry = {"event": event, "at": round(at if at is not None else time.time(), 3), "detail": detail}
        later = [i for i, e in enumerate(self.events) if e["at"] > entry["at"]]
        self.events.insert(later[0] if later else len(self.events), entry)

    def lines(self) -> list[str]:
        """``+12.3 s  replacement asked  node-2`` relative to the first event."""
        if not self.events:
            return []
        t0 = self.events[0]["at"]
        out = [f"  recovery timeline (seconds from the {self.events[0]['event']}):"]
        out += [f"    +{e['at'] - t0:7.1f} s  {e['event']}{'  ' + e['detail'] if e['detail'] else ''}"
                for e in self.events]
        if self.steps_lost:
            out.append(f"  steps lost: {', '.join(map(str, self.steps_lost))} (per recovery)")
        return out


def snapshot_kind(resumed: dict) -> str:
    """The snapshot a recovered job resumed from (its ``RESUMED`` report) in words: whose, which step, where."""
    where = resumed.get("snapshot_from", "?")
    if not isinstance(resumed.get("step"), int):
        return "no snapshot (a fresh start)"
    if resumed.get("survivor"):
        return f"the surviving ranks' snapshot of step {resumed['step']} (their last completed step, epoch {resumed.get('epoch')}), {where}"
    if resumed.get("consumed"):
        return (f"the coordinated checkpoint of step {resumed['step']} (epoch {resumed.get('epoch')}, "
                f"{resumed['consumed']} samples in), {where}")
    return f"the periodic snapshot of step {resumed['step']} (before epoch {resumed.get('epoch')}), {where}"
