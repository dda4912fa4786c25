"""The ledger in words (:mod:`multinode.diagnose.ledger`): the run's last line, ``goodput 91 % of 5m12s: training
4m44s, start 14s, ...``, and the durations the report writes."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``4m44s``, ``14s``, ``0.4s``, ``1h02m``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def goodput_line(ledger: dict) -> str:
    """``goodput 91 % of 5m12s: training 4m44s, start 14s, ...`` (training first, then the others by size)."""
    buckets = ledger["buckets"]
    others = sorted(((k, v) for k, v in buckets.items() if k != "training" and v >= 0.05), key=lambda kv: -kv[1])
    parts = [f"training {duration(buckets['training'])}"] + [f"{k} {duration(v)}" for k, v in others]
    share = ledger["goodput"] or 0.0
    if not buckets["training"] and buckets.get("job", 0.0) > 0:  # a script that reports no step: its start and its
        parts = [f"job {duration(buckets['job'])} (start and steps: the script reports no step)"] + [  # steps in one
            f"{k} {duration(v)}" for k, v in others if k != "job"]
        return f"goodput not known of {duration(ledger['wall_seconds'])}: {', '.join(parts)}"
    line = f"goodput {share * 100:.0f} % of {duration(ledger['wall_seconds'])}: {', '.join(parts)}"
    restarts = len(ledger.get("job_restarts") or ())
    if ledger["recoveries"] or restarts:
        count, twice = len(ledger["recoveries"]) + restarts, ledger["steps_trained_twice"]
        line += f" ({count} recover{'y' if count == 1 else 'ies'}, {twice} step{'' if twice == 1 else 's'} trained twice)"
    held = [f"{r['node']} rank {r['rank']} {duration(r['seconds'])}" if r["node"] else
            f"no single rank {duration(r['seconds'])}" for r in ledger.get("slow_steps_by_rank") or ()]
    return line + (f"; slow steps held back by {', '.join(held)}" if held else "")
