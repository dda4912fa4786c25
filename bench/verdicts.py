"""Targets and verdicts: every benchmark claim is judged by code, from the measured value, never by hand.

A section's ``judge(result)`` returns a list of verdicts (plain dicts, stored in benchmarks.json):

    {"claim": "MPI / DDP step time", "value": 0.7013, "target": "<= 0.7", "met": false,
     "runs": [{"label": "pair 1", "value": 0.6931, "met": true}, ...], "met_in": "1 of 3 pairs"}

``value`` is the measured figure as stored (no rounding); ``met`` compares that very number with the
threshold. ``runs`` (optional) judges every repeat on its own, so a target met only in some runs says so.

Every paired section is judged by one rule, :func:`paired`: the value is the median of the paired ratios
(each repeat's ours / baseline, measured back to back), and the verdict is "met" when every pair meets the
target, "NOT met" when none does, "inconclusive" when the pairs fall on both sides of it. A pair whose figure
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


RULE = "median of paired ratios"
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
    sides = {r["met"] for r in out.get("runs", ())}
    out["verdict"] = "inconclusive" if len(sides) != 1 else "met" if sides == {True} else "NOT met"
    out["met"] = out["verdict"] == "met"
    out["rule"] = RULE
    if flagged:
        out["flagged"] = [{"label": label, "value": v, "why": why} for label, v, why in flagged]
    return out


def word(v: dict) -> str:
    """'met', 'NOT met' or 'inconclusive' (verdicts stored before the one rule carry only ``met``)."""
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
    for f in v.get("flagged", ()):
        text += f"; {f['label']} ({shown(f['value'], target)}) not counted: {f['why']}"
    return text
