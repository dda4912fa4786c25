"""Targets and verdicts: every benchmark claim is judged by code, from the measured value, never by hand.

A section's ``judge(result)`` returns a list of verdicts (plain dicts, stored in benchmarks.json):

    {"claim": "MPI / DDP step time", "value": 0.7013, "target": "<= 0.7", "met": false,
     "runs": [{"label": "pair 1", "value": 0.6931, "met": true}, ...], "met_in": "1 of 3 pairs"}

``value`` is the measured figure as stored (no rounding); ``met`` compares that very number with the
threshold. ``runs`` (optional) judges every repeat on its own, so a target met only in some runs says so.

Every paired section is judged by one rule, :func:`paired`: the value is the median of the paired ratios
(each repeat's ours / baseline, measured back to back), and the verdict is the side of the target the pairs
establish by the sign test of that median: "met" when at least :func:`enough` of the n pairs meet the target --
the fewest that pairs whose median lay on the other side would give with probability at most :data:`ALPHA` --
"NOT met" when that many miss it, else "inconclusive". Under 5 pairs no count is that unlikely, and the verdict
takes all of them (one run decides a one-run target). How many pairs a section needs so that its verdict does not
flip between runs of one commit is :func:`pairs_needed` of the chance that one pair lands on the wrong side (each
section says where its chance comes from).

A section that began above the machine's load limit (``bench.provenance.load_flag``) measured other work too:
each of its verdicts is "inconclusive (load)", never met (:func:`loaded`; ``bench.report`` applies it). A pair whose figure
is physically impossible (above its ceiling, e.g. faster across namespaces than within one) is flagged
with the reason and not counted; "above" is the same test everywhere, :func:`over_ceiling`: more than
:data:`CEILING_TOLERANCE` above the ceiling (within it, a figure is taken as at the ceiling). Targets on one
figure per run (seconds a phase adds, steps lost, seconds to exit) go by the same rule over their runs.
:func:`shown` prints a value with as many decimals as it takes for the printed number to fall on the
same side of the threshold as the measured one (0.7013 against "<= 0.7" prints as 0.701, not 0.70).
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
import math
from math import comb

_OPS = {"<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True)
class Target:
    op: str  # "<=" or ">="
    threshold: float

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"target operator {self.op!r}: use one of {sorted(_OPS)}")

    def met(self, value: float) -> bool:
        return bool(_OPS[self.op](value, self.threshold))

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}"


def shown(value: float, target: Target, decimals: int = 2) -> str:
    """``value`` with at least ``decimals`` decimals, more where fewer would cross the threshold."""
    for places in range(decimals, 8):
        text = f"{value:.{places}f}"
        if target.met(float(text)) == target.met(value) and (float(text) != target.threshold or value == target.threshold):
            return text
    return repr(value)


def verdict(claim: str, value: float, target: Target, runs: Iterable[tuple[str, float]] = (),
            run_noun: str = "runs") -> dict:
    """One judged claim; ``runs``: (label, value) of each repeat, each judged against the same target."""
    out = {"claim": claim, "value": value, "target": str(target), "met": target.met(value)}
    runs = list(runs)
    if runs:
        out["runs"] = [{"label": label, "value": v, "met": target.met(v)} for label, v in runs]
        out["met_in"] = f"{sum(r['met'] for r in out['runs'])} of {len(runs)} {run_noun}"
    return out


RULE = "median of paired ratios, sign test"
ALPHA = 0.05  # a verdict's risk: the chance that pairs whose median lies on the other side would give it
LOADED = "inconclusive (load)"


def enough(n: int, alpha: float = ALPHA) -> int:
    """The fewest of ``n`` pairs on one side of a target that make it the verdict: the smallest k with
    P(X >= k) <= ``alpha`` for X ~ Binomial(n, 1/2) -- the sign test of the median -- or n where none is (n < 5)."""
    for k in range(n + 1):
        if sum(comb(n, j) for j in range(k, n + 1)) / 2**n <= alpha:
            return k
    return n


def reaches(n: int, q: float) -> float:
    """The chance that ``n`` pairs, each on the wrong side of the target with chance ``q``, still reach
    :func:`enough` on the right side."""
    k = enough(n)
    return sum(comb(n, j) * (1 - q) ** j * q ** (n - j) for j in range(k, n + 1))


def pairs_needed(q: float, miss: float = ALPHA, most: int = 60) -> int:
    """The fewest pairs whose verdict misses the side the target is truly on with chance at most ``miss``, when a
    pair lands on the wrong side with chance ``q``: how many pairs keep a section's verdict from flipping. At least
    as many as the sign test needs to decide at :data:`ALPHA` at all (5)."""
    decides = next(n for n in range(1, most + 1) if enough(n) < n or 2.0**-n <= ALPHA)
    return next(n for n in range(decides, most + 1) if 1 - reaches(n, q) <= miss)


def wrong_side(center: float, spread: float, target: "Target") -> float:
    """The chance that a pair lands on the wrong side of ``target`` when pairs scatter normally around ``center``
    with standard deviation ``spread`` (a section's recorded pairs)."""
    z = (target.threshold - center) / spread
    below = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return below if target.op == ">=" else 1 - below


def loaded(v: dict, why: str) -> dict:
    """A verdict of a section that began above the load limit: inconclusive, never met; ``why`` kept."""
    return {**v, "verdict": LOADED, "met": False, "load": why}
# A figure at most 1 % above its physical ceiling counts as at the ceiling: two timings of the same transfer
# differ by that much (a chosen tolerance, stated; 1.667 against a ceiling of 1.665 is 0.1 % above it).
CEILING_TOLERANCE = 0.01


def over_ceiling(value: float, ceiling: float, tolerance: float = CEILING_TOLERANCE) -> bool:
    """Whether ``value`` is above its physical ``ceiling`` by more than ``tolerance`` (a fraction of it)."""
    return value > ceiling * (1 + tolerance)


def paired(claim: str, pairs: Iterable[tuple[str, float]], target: Target, run_noun: str = "pairs",
           flagged: Iterable[tuple[str, float, str]] = ()) -> dict:
    """The one verdict rule of a paired section (module docstring); ``flagged``: (label, value, why) of
    pairs left out because their figure exceeds a physical ceiling."""
    pairs, flagged = list(pairs), list(flagged)
    if not pairs and not flagged:
        raise ValueError(f"{claim}: nothing measured to judge")
    value = statistics.median(v for _, v, *_ in (pairs or flagged))  # all flagged: shown, judged inconclusive
    out = verdict(claim, value, target, pairs, run_noun)
    met = sum(r["met"] for r in out.get("runs", ()))
    need = enough(len(pairs)) if pairs else 1
    out["verdict"] = "met" if pairs and met >= need else "NOT met" if pairs and len(pairs) - met >= need else "inconclusive"
    out["needed"] = need
    out["met"] = out["verdict"] == "met"
    out["rule"] = RULE
    if flagged:
        out["flagged"] = [{"label": label, "value": v, "why": why} for label, v, why in flagged]
    return out


def word(v: dict) -> str:
    """'met', 'NOT met', 'inconclusive' or 'inconclusive (load)' (verdicts stored before the one rule carry only
    ``met``)."""
    return v.get("verdict") or ("met" if v["met"] else "NOT met")


def parse_target(text: str) -> Target:
    op, threshold = text.split()
    return Target(op, float(threshold))


def attach(result: dict, verdicts: list[dict], target: str) -> dict:
    """Store the verdicts in a section's result: ``target`` (what the section is judged against),
    ``met`` (every verdict met) and ``verdicts`` (each claim). Returns ``result``."""
    result["target"] = target
    result["met"] = all(v["met"] for v in verdicts)
    result["verdicts"] = verdicts
    return result


def describe(v: dict) -> str:
    """'0.701 (target <= 0.7): NOT met; met in 1 of 3 pairs (0.693, 0.701, 0.703)', and what was flagged."""
    target = parse_target(v["target"])
    text = f"{shown(v['value'], target)} (target {v['target']}): {word(v)}"
    if "runs" in v:
        values = ", ".join(shown(r["value"], target) for r in v["runs"])
        text += f"; met in {v['met_in']} ({values})"
        if v.get("needed", len(v["runs"])) < len(v["runs"]):
            text += f"; a side takes {v['needed']} of {len(v['runs'])} (sign test, {ALPHA:g})"
    if v.get("load"):
        text += f"; {v['load']}"
    for f in v.get("flagged", ()):
        text += f"; {f['label']} ({shown(f['value'], target)}) not counted: {f['why']}"
    return text
