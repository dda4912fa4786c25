"""Targets and verdicts: every benchmark claim is judged by code, from the measured value, never by hand.

A section's ``judge(result)`` returns a list of verdicts (plain dicts, stored in benchmarks.json):

    {"claim": "MPI / DDP step time", "value": 0.7013, "target": "<= 0.7", "met": false,
     "runs": [{"label": "pair 1", "value": 0.6931, "met": true}, ...], "met_in": "1 of 3 pairs"}

``value`` is the measured figure as stored (no rounding); ``met`` compares that very number with the
threshold. ``runs`` (optional) judges every repeat on its own, so a target met only in some runs says so.
:func:`shown` prints a value with as many decimals as it takes for the printed number to fall on the
same side of the threshold as the measured one (0.7013 against "<= 0.7" prints as 0.701, not 0.70).
"""

from __future__ import annotations

import operator
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
    """'0.701 (target <= 0.7): NOT met; met in 1 of 3 pairs (0.693, 0.701, 0.703)'."""
    target = parse_target(v["target"])
    text = f"{shown(v['value'], target)} (target {v['target']}): {'met' if v['met'] else 'NOT met'}"
    if "runs" in v:
        values = ", ".join(shown(r["value"], target) for r in v["runs"])
        text += f"; met in {v['met_in']} ({values})"
    return text
