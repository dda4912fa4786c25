"""``make report [RUN=<run-id>]``: one self-contained HTML page per run, ``report.html`` in its run directory.

What the run recorded, drawn (:mod:`multinode.diagnose.report_plots`, PNGs embedded as base64): the ledger as a
bar and a table (:mod:`multinode.diagnose.ledger`), a timeline per node (each attempt's phases, the checkpoints,
the recovery's notices, losses, replacements and resizes), each rank's compute per step-time window with the
slow ranks marked (named while the job trained, or holding steps back in the ledger's slow steps), loss and accuracy
per epoch, each rank's step time per epoch, and the throughput. The page loads nothing (no script, no stylesheet, no font from anywhere): it opens from
the file on a machine without a network. A section whose data the run did not record (a user script writes no
``metrics.jsonl``) says so in a line instead of a figure.

Sources, all in the run directory: ``summary.json`` (the ledger, the outcome; a recovered run's earlier attempts'
under ``attempt-<k>/`` and ``grow-<k>/`` for the ranks they named slow), ``recovery.json`` (the timeline),
``metrics.jsonl`` (our trainer's rows per epoch; a recovered run's earlier attempts keep theirs under
``attempt-<k>/`` and ``grow-<k>/``, a later attempt's row for the same epoch wins).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from multinode.core.errors import UserError
from multinode.core.rundir import RunDir
from multinode.diagnose import report_plots as plots
from multinode.diagnose.goodput import duration, goodput_line

SECTIONS = ("ledger", "timeline", "compute", "loss", "step-time", "throughput")
NAME = "report.html"
STYLE = """body{font-family:sans-serif;margin:24px;max-width:1000px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}
img{max-width:100%}.note{color:#666;font-size:13px}"""


def write(run_dir: Path) -> Path:
    """The page for the run in ``run_dir``, written there; its path. A directory without ``summary.json`` (a run
    that never started, or still running) is a UserError naming it."""
    summary_path = RunDir(run_dir).summary
    if not summary_path.exists():
        raise UserError(f"run {run_dir.name} has no summary.json yet (still running, or refused before it started); "
                        "pick another with RUN=<run-id>")
    summary = json.loads(summary_path.read_text())
    recovery = _json(RunDir(run_dir).recovery) or summary.get("recovery") or {}
    page = render({**summary, "slow_ranks": named_slow(run_dir, summary)}, recovery, epoch_rows(run_dir))
    path = run_dir / NAME
    path.write_text(page)
    return path


def named_slow(run_dir: Path, summary: dict) -> list[dict] | None:
    """The ranks named slow in every attempt (each attempt's summary names its own: a recovered run's earlier ones
    are kept under ``attempt-<k>/`` and ``grow-<k>/``), each (rank, node) once."""
    found: dict[tuple[int, str], dict] = {}
    kept = [RunDir(where).summary for where in RunDir(run_dir).attempts()[:-1]]
    for named in [(_json(path) or {}).get("slow_ranks") for path in kept] + [summary.get("slow_ranks")]:
        for slow in named or ():
            found.setdefault((slow["rank"], slow["node"]), slow)
    return list(found.values()) or None


def epoch_rows(run_dir: Path) -> list[dict]:
    """Our trainer's rows per epoch from every attempt's ``metrics.jsonl``, one per epoch (the latest attempt's)."""
    rows: dict[int, dict] = {}
    for path in (RunDir(where).metrics for where in RunDir(run_dir).attempts()):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("epoch"), int) and "event" not in row:
                rows[row["epoch"]] = row
    return [rows[k] for k in sorted(rows)]


def render(summary: dict, recovery: dict, rows: list[dict]) -> str:
    """The whole page as one string (pure: the figures are drawn here, nothing is read or written)."""
    ledger = summary.get("ledger")
    began = (ledger or {}).get("began_unix", 0.0)
    events = [{**e, "t": e["at"] - began} for e in recovery.get("events", []) if isinstance(e.get("at"), (int, float))]
    parts = [f"<h1>run {_e(summary['run_id'])}: {_e(summary.get('outcome', '?'))}, {summary['nodes']} node(s), "
             f"world size {summary['world_size']}, wall {duration(summary['wall_seconds'])}</h1>"]
    if ledger:
        parts.append(_section("ledger", "Where the time went", _e(goodput_line(ledger)), plots.ledger_bar(ledger),
                              _ledger_table(ledger)))
        parts.append(_section("timeline", "Timeline per node", f"{len(ledger.get('attempts', []))} attempt(s); "
                              f"{len(events)} recovery event(s)", plots.node_timeline(ledger, events),
                              _events_table(events)))
        parts.append(_compute_section(summary, ledger))
    else:
        parts += [_section(s, s, "this run's summary has no ledger (a run from before the ledger)", None)
                  for s in ("ledger", "timeline", "compute")]
    none = "no per-epoch metrics in this run (metrics.jsonl is our trainer's; a user script writes none)"
    figures = (("loss", "Loss and accuracy per epoch", plots.loss_accuracy),
               ("step-time", "Step time per rank", plots.step_time_per_rank),
               ("throughput", "Throughput", plots.throughput))
    for key, title, draw in figures:
        parts.append(_section(key, title, f"{len(rows)} epoch(s)" if rows else none, draw(rows) if rows else None))
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>run {_e(summary['run_id'])}"
            f"</title><style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")


def slow_ranks(summary: dict, ledger: dict) -> list[dict]:
    """The ranks the page marks: named slow while the job trained (the summary's ``slow_ranks``) or holding steps
    back in the ledger's slow steps; ``{"rank", "node", "why"}`` each, once."""
    why: dict[tuple[int, str], list[str]] = {}
    for slow in summary.get("slow_ranks") or ():
        why.setdefault((slow["rank"], slow["node"]), []).append(
            f"named slow ({slow['ratio']:.1f}x the others' compute)")
    for held in ledger.get("slow_steps_by_rank") or ():
        if held["node"] is not None:
            why.setdefault((held["rank"], held["node"]), []).append(
                f"held steps back {duration(held['seconds'])}")
    return [{"rank": rank, "node": node, "why": "; ".join(reasons)} for (rank, node), reasons in why.items()]


def _compute_section(summary: dict, ledger: dict) -> str:
    title = "Compute per rank"
    if not any(a.get("compute") for a in ledger.get("attempts", [])):
        return _section("compute", title, "no step-time windows in this run (STEPTIMES: our trainer's, under the "
                        "orchestrator)", None)
    marked = slow_ranks(summary, ledger)
    note = ("; ".join(f"{m['node']} rank {m['rank']}: {m['why']}" for m in marked) if marked else
            "no rank named slow and none held steps back")
    return _section("compute", title, _e(note), plots.compute_per_rank(ledger, marked))


def _section(key: str, title: str, note: str, png: bytes | None, extra: str = "") -> str:
    image = (f'<img id="{key}-figure" alt="{_e(title)}" src="data:image/png;base64,'
             f'{base64.b64encode(png).decode()}">') if png else ""
    return f'<section id="{key}"><h2>{_e(title)}</h2><p class="note">{note}</p>{image}{extra}</section>'


def _ledger_table(ledger: dict) -> str:
    wall = ledger["wall_seconds"] or 1.0
    rows = [f"<tr><td>{_e(k)}</td><td>{v:.1f}</td><td>{100 * v / wall:.1f} %</td></tr>"
            for k, v in ledger["buckets"].items() if v > 0]
    rows += [f"<tr><td>recovery {r['recovery']}: detect / replace / restart</td><td>{r['detect']:.1f} / "
             f"{r['replace']:.1f} / {r['restart']:.1f}</td><td></td></tr>" for r in ledger.get("recoveries", [])]
    return ("<table><tr><th>bucket</th><th>seconds</th><th>share</th></tr>" + "".join(rows) +
            f"<tr><td>steps trained twice</td><td>{ledger.get('steps_trained_twice', 0)}</td><td></td></tr></table>")


def _events_table(events: list[dict]) -> str:
    if not events:
        return ""
    rows = "".join(f"<tr><td>+{e['t']:.1f} s</td><td>{_e(e['event'])}</td><td>{_e(e.get('detail', ''))}</td></tr>"
                   for e in events)
    return f"<table><tr><th>since the run began</th><th>event</th><th>detail</th></tr>{rows}</table>"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError:
        return None


def _e(text: str) -> str:
    return html.escape(str(text))
