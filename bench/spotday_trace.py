"""The spot day's trace: a seeded list of events in time for the replay's nodes, generated from published figures.

``python -m bench.spotday_trace --seed 7`` writes ``bench/traces/spotday-<seed>.json`` (the committed trace is one
such file; the generator and its sources are here). Each event is one of :data:`KINDS`:

* ``notice``: a spot interruption notice on a node, which AWS takes :data:`NOTICE_LEAD` seconds later;
* ``lost``: a node gone without a notice;
* ``rebalance``: a rebalance recommendation on a node (elevated risk; before a notice, or alone);
* ``no_capacity``: every replacement refused for ``seconds`` (starting at an interruption);
* ``slow``: a node held to ``share`` of a CPU for ``seconds`` (a noisy neighbour, a throttled CPU).

A ``notice`` or ``lost`` event carries ``replacement``: the seconds a new node takes to be ready.

The model, in real time (:data:`SOURCES` cites each figure; what no source gives is marked *chosen*):
interruptions come to each node as a Poisson process at :data:`INTERRUPTIONS_PER_MONTH` (the Spot Instance
Advisor's top band, ">20 %": the rate at which Spot reclaimed capacity in the trailing month); an interruption is
a notice, or (1 in :data:`LOST_ONE_IN`, *chosen*: notices are "best effort") a loss without one; a rebalance
recommendation comes 10 to 30 minutes before half of them (*chosen*; AWS: it "can arrive sooner than" the notice,
or with it), and alone at :data:`REBALANCE_ALONE_PER_MONTH` (*chosen*); one interruption in
:data:`SHORTAGE_ONE_IN` (*chosen*) is followed by a capacity shortage of 2 to 4 minutes (AWS: "wait a few minutes"); slowdowns come at
:data:`SLOW_PER_MONTH` (*chosen*) and last 60 to 120 s at :data:`SLOW_SHARE` of a core (*chosen*: enough to push
a slowed rank's step past its pace). A replacement takes 40 to 180 s (uniform).

**Compression.** A 4-node cluster at that rate sees an interruption every few weeks: the trace keeps the first
:data:`EVENTS` events (a seed whose events hold every kind: :func:`main` tries the next seeds until one does) and
compresses the real time *between* them by one factor (written in the file as ``factor``), the least that brings
them between :data:`FIRST_AT` and :data:`LAST_AT` seconds of the replay; a gap that
compresses below :data:`MIN_GAP` seconds is stretched to it (each method meets one event at a time, not a burst;
the real gap is in the file; a shortage starts with its interruption). Never compressed: a notice's lead, a
replacement's delay, a shortage's or a slowdown's length -- they are the replay's seconds as they are AWS's.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("notice", "lost", "rebalance", "no_capacity", "slow")
NODES = 4
TRACES = Path(__file__).resolve().parent / "traces"
MONTH = 30 * 24 * 3600.0
NOTICE_LEAD = 120.0
INTERRUPTIONS_PER_MONTH = 0.20
LOST_ONE_IN = 3
REBALANCE_ALONE_PER_MONTH = 0.05
SHORTAGE_ONE_IN = 3
SLOW_PER_MONTH = 0.05
SLOW_SHARE = 0.03
REPLACEMENT = (40.0, 180.0)
SHORTAGE = (120.0, 240.0)
SLOW_SECONDS = (60.0, 120.0)
REBALANCE_LEAD = (600.0, 1800.0)
EVENTS = 10
FIRST_AT, LAST_AT, MIN_GAP = 90.0, 780.0, 45.0

SOURCES = {
    "interruption frequency": "Spot Instance Advisor, aws.amazon.com/ec2/spot/instance-advisor/: 'Frequency of "
    "interruption represents the rate at which Spot has reclaimed capacity during the trailing month. They are in "
    "ranges of < 5%, 5-10%, 10-15%, 15-20% and >20%' (the advisor's data file, spot-bid-advisor.s3.amazonaws.com/"
    "spot-advisor-data.json, as quoted by pkg.go.dev/github.com/grailbio/base/cloud/spotadvisor); the top band's "
    "floor, 20 % a month, per node",
    "notice lead": "docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html: 'a warning "
    "that is issued two minutes before Amazon EC2 stops or terminates your Spot Instance'; 'Interruption notices "
    "are emitted on a best effort basis' (hence losses without one)",
    "rebalance recommendation": "docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html: 'The "
    "signal can arrive sooner than the two-minute Spot Instance interruption notice' ... 'can arrive along with "
    "the two-minute interruption notice'",
    "launch to ready": "40 s: an EC2 instance's launch to boot with default settings (Depot, 'Making EC2 boot time 8x "
    "faster', depot.dev/blog/faster-ec2-boot-time, 2024-05-23); up to 180 s: within 'Node provisioning: The cloud "
    "provider spins up a VM (1-5 minutes from zero)' (Union.ai, 'We cut container cold boot from minutes to "
    "seconds', union.ai/blog-post/we-cut-container-cold-boot-from-minutes-to-seconds-heres-how)",
    "no capacity": "docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html: 'UnfulfillableCapacity: At "
    "this time there isn't enough spare capacity to fulfill your request for Spot Instances. You can wait a few "
    "minutes to see whether capacity becomes available'",
    "slowed node": "docs.aws.amazon.com/AWSEC2/latest/UserGuide/burstable-performance-instances-standard-mode.html: "
    "'If the instance is running low on accrued credits, CPU utilization is gradually lowered to the baseline "
    "level' (a throttled CPU; a noisy neighbour looks the same from inside the job)",
}


@dataclass(frozen=True)
class Event:
    """One event of the replay, ``at`` seconds after a method's ``train`` started (module doc)."""

    at: float
    kind: str
    node: int | None = None
    replacement: float | None = None  # notice, lost: seconds the new node takes to be ready
    seconds: float | None = None  # notice: its lead; no_capacity, slow: how long
    share: float | None = None  # slow: the CPU share the node is held to
    real_gap_hours: float = 0.0  # real time since the previous event, before compression

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if (self.node is None) != (self.kind == "no_capacity"):
            raise ValueError(f"{self.kind} at {self.at} s: a node for every kind but no_capacity")
        if self.kind in ("notice", "lost") and not (self.replacement or 0) > 0:
            raise ValueError(f"{self.kind} at {self.at} s needs the seconds its replacement takes")
        if self.kind in ("notice", "no_capacity", "slow") and not (self.seconds or 0) > 0:
            raise ValueError(f"{self.kind} at {self.at} s needs its seconds")
        if self.kind == "slow" and not 0 < (self.share or 0) < 1:
            raise ValueError(f"slow at {self.at} s needs a CPU share between 0 and 1")


@dataclass(frozen=True)
class Trace:
    seed: int
    nodes: int
    factor: float  # real seconds per replay second between events
    events: tuple[Event, ...]
    quick: bool = False

    def kinds(self) -> dict[str, int]:
        counts = {kind: sum(e.kind == kind for e in self.events) for kind in KINDS}
        return {kind: n for kind, n in counts.items() if n}

    def to_json(self) -> dict:
        return {"seed": self.seed, "nodes": self.nodes, "factor": round(self.factor, 1), "quick": self.quick,
                "kinds": self.kinds(), "model": model(), "sources": SOURCES,
                "events": [{k: v for k, v in asdict(e).items() if v is not None} for e in self.events]}


def model() -> dict:
    """The generator's parameters, as written into every trace."""
    return {"interruptions_per_node_month": INTERRUPTIONS_PER_MONTH, "lost_one_in": LOST_ONE_IN,
            "rebalance_alone_per_node_month": REBALANCE_ALONE_PER_MONTH, "shortage_one_in": SHORTAGE_ONE_IN,
            "slow_per_node_month": SLOW_PER_MONTH, "slow_share": SLOW_SHARE, "notice_lead_s": NOTICE_LEAD,
            "replacement_s": list(REPLACEMENT), "shortage_s": list(SHORTAGE), "slow_s": list(SLOW_SECONDS),
            "rebalance_lead_s": list(REBALANCE_LEAD), "first_at_s": FIRST_AT, "last_at_s": LAST_AT,
            "min_gap_s": MIN_GAP}


def _draw(rng: random.Random, nodes: int) -> list[tuple[float, dict]]:
    """(real seconds, event fields) of the model's events in time order, until there are EVENTS of them."""
    rates = {"interruption": INTERRUPTIONS_PER_MONTH, "rebalance": REBALANCE_ALONE_PER_MONTH, "slow": SLOW_PER_MONTH}
    total = nodes * sum(rates.values()) / MONTH
    now, found = 0.0, []
    while len(found) < EVENTS:
        now += rng.expovariate(total)
        node = rng.randrange(nodes)
        what = rng.choices(list(rates), weights=list(rates.values()))[0]
        if what == "slow":
            found.append((now, {"kind": "slow", "node": node, "seconds": round(rng.uniform(*SLOW_SECONDS)),
                                "share": SLOW_SHARE}))
        elif what == "rebalance":
            found.append((now, {"kind": "rebalance", "node": node}))
        else:
            if rng.random() < 0.5:  # a recommendation before half of the interruptions, 10 to 30 minutes (chosen)
                found.append((now - rng.uniform(*REBALANCE_LEAD), {"kind": "rebalance", "node": node}))
            kind = "lost" if rng.randrange(LOST_ONE_IN) == 0 else "notice"
            lead = {"seconds": NOTICE_LEAD} if kind == "notice" else {}
            found.append((now, {"kind": kind, "node": node, **lead, "replacement": round(rng.uniform(*REPLACEMENT))}))
            if rng.randrange(SHORTAGE_ONE_IN) == 0:  # from the interruption on
                found.append((now, {"kind": "no_capacity", "seconds": round(rng.uniform(*SHORTAGE))}))
    return sorted(found, key=lambda pair: pair[0])[:EVENTS]


def generate(seed: int, nodes: int = NODES) -> Trace:
    """The trace of ``seed`` (module doc): the model's first EVENTS events, their gaps compressed by one factor, the
    least that brings the last one to LAST_AT (gaps stretched to MIN_GAP included)."""
    drawn = _draw(random.Random(seed), nodes)
    real = [t - drawn[0][0] for t, _ in drawn]
    low, high = 1.0, max(real[-1], 1.0)
    for _ in range(60):  # the last event's time falls as the factor grows, down to the stretched gaps' floor
        middle = (low + high) / 2
        low, high = (middle, high) if _placed(drawn, real, middle)[-1].at > LAST_AT else (low, middle)
    return Trace(seed, nodes, high, tuple(_placed(drawn, real, high)))


def _placed(drawn: list[tuple[float, dict]], real: list[float], factor: float) -> list[Event]:
    events: list[Event] = []
    at, before = FIRST_AT, 0.0
    for (_, fields), since in zip(drawn, real):
        gap = since - before
        if events:  # a shortage starts with its interruption; any other event MIN_GAP after the one before
            at += 0.0 if fields["kind"] == "no_capacity" and gap == 0 else max(gap / factor, MIN_GAP)
        fields = dict(fields)
        events.append(Event(round(at, 1), node=fields.pop("node", None), real_gap_hours=round(gap / 3600, 1),
                            **fields))
        before = since
    return events


def acceptable(trace: Trace) -> bool:
    """Enough of the replay to judge: EVENTS events (the issue asks for 8 or more), every kind among them."""
    return len(trace.events) >= EVENTS and len(trace.kinds()) == len(KINDS)


# The slowdown ends 15 s before the loss: a node held so hard that its steps barely move, then lost at once, left no
# slow step to see -- the survivors' pause runs from the last step completed before a loss, and took the slowdown in
# (loaded runs of the quick replay: recovery 27 s and no slow step, at 0.01 of a core and at a millisecond a second).
QUICK_SLOW_SHARE = 0.01  # the kernel's least quota in its 100 ms period (the full trace's 0.03 is milder)
QUICK = Trace(0, NODES, 1.0, (Event(30.0, "slow", node=2, seconds=25.0, share=QUICK_SLOW_SHARE),
                              Event(70.0, "lost", node=1, replacement=20.0)), quick=True)
"""The suite's quick mode: two events, a 20 s replacement -- shortened, not the published figures; its numbers mean
nothing."""


def off_model(trace: Trace) -> list[str]:
    """The events of a (non-quick) trace whose figures fall outside the published ranges the model draws from
    (:data:`SOURCES`): a notice's lead, a replacement's, a shortage's and a slowdown's seconds; one line each."""
    ranges = {"replacement": REPLACEMENT, "no_capacity": SHORTAGE, "slow": SLOW_SECONDS}
    found = []
    for e in trace.events:
        checks = [("replacement", e.replacement, ranges["replacement"])] if e.kind in ("notice", "lost") else []
        if e.kind == "notice":
            checks.append(("notice lead", e.seconds, (NOTICE_LEAD, NOTICE_LEAD)))
        if e.kind in ("no_capacity", "slow"):
            checks.append((e.kind, e.seconds, ranges[e.kind]))
        found += [f"{e.kind} at {e.at} s: {what} {value} s is outside {low:g}-{high:g} s"
                  for what, value, (low, high) in checks if not low <= value <= high]
    return found


def load(path: Path) -> Trace:
    """A trace file; ValueError when a figure of a full trace is outside the model's published ranges."""
    data = json.loads(path.read_text())
    events = tuple(Event(**{k: v for k, v in e.items()}) for e in data["events"])
    trace = Trace(data["seed"], data["nodes"], data["factor"], events, data.get("quick", False))
    wrong = [] if trace.quick else off_model(trace)
    if wrong:
        raise ValueError(f"{path}: {'; '.join(wrong)}")
    return trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spotday_trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the first seed to try; the next ones until one gives "
                        f"{EVENTS} events of every kind")
    parser.add_argument("--out", type=Path, help="default: bench/traces/spotday-<seed>.json")
    args = parser.parse_args(argv)
    seed = args.seed
    while not acceptable(trace := generate(seed)):
        seed += 1
    out = args.out or TRACES / f"spotday-{seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace.to_json(), indent=1) + "\n")
    print(f"wrote {out}: seed {seed}, {len(trace.events)} events ({trace.kinds()}), factor {trace.factor:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
