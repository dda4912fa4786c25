"""The run report's figures (:mod:`multinode.diagnose.run_report`), drawn here with matplotlib (pinned in
pyproject.toml; the Agg backend, no display) and returned as PNG bytes for the page to embed. Each takes what the
run recorded -- the ledger (``summary.json``: its buckets, its attempts with each rank's compute per step-time
window), the recovery timeline, the rows of ``metrics.jsonl`` -- and draws it; none reads a file or the network."""

from __future__ import annotations

import contextlib
import io

# One colour per ledger bucket (multinode.diagnose.ledger.BUCKETS), the same in every figure.
COLOURS = {"wait": "#9e9e9e", "pre-flight": "#8d6e63", "sync": "#ffb74d", "start": "#ffd54f", "training": "#43a047",
           "slow steps": "#f4511e", "missing capacity": "#c0ca33", "checkpoint": "#1e88e5", "recovery": "#e53935", "trained twice": "#8e24aa", "teardown": "#78909c",
           "job": "#26a69a", "other": "#bdbdbd"}
# Which colour a phase span of the timeline gets (the orchestrator's phase -> the bucket it mostly feeds).
PHASE_COLOUR = {"claim": "wait", "pre-flight": "pre-flight", "link check": "pre-flight", "GPU smoke test": "pre-flight",
                "sync": "sync", "data": "sync", "start": "start", "job": "job", "sweep": "teardown", "summary": "teardown",
                "recover": "recovery"}
EVENT_MARK = {"notice": ("v", "#e53935"), "node lost": ("X", "#b71c1c"), "checkpoint written": ("s", "#1e88e5"),
              "replacement asked": ("^", "#fb8c00"), "node ready": ("o", "#43a047"),
              "job started again": (">", "#2e7d32"), "going on without it": ("D", "#6d4c41"),
              "node back": ("o", "#00897b"), "replacement refused": ("x", "#6d4c41"),
              "collective failed": ("P", "#8e24aa")}


@contextlib.contextmanager
def _figure(box: list, **subplots):
    """(fig, axes) of a headless figure; its PNG bytes appended to ``box`` on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")  # the legends below the axes included
        box.append(buffer.getvalue())
    finally:
        plt.close(fig)


def ledger_bar(ledger: dict) -> bytes:
    """The wall time as one horizontal bar, a segment per bucket, in the ledger's order."""
    box: list = []
    with _figure(box, figsize=(10, 1.3)) as (_, ax):
        left = 0.0
        for name, seconds in ledger["buckets"].items():
            if seconds <= 0:
                continue
            ax.barh(0, seconds, left=left, color=COLOURS.get(name, "#bdbdbd"), edgecolor="white",
                    label=f"{name} {seconds:.1f} s")
            left += seconds
        ax.set_yticks([])
        ax.set_xlim(0, max(ledger["wall_seconds"], 1e-3))
        ax.set_xlabel("seconds of the run's wall time")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=6, fontsize=8, frameon=False)
    return box[0]


def node_timeline(ledger: dict, events: list[dict]) -> bytes:
    """One row per node: each attempt's phases on the nodes it ran on, its checkpoints as ticks, and the recovery
    timeline's events (a notice, a loss, a replacement ...) on the node they name (every row when none)."""
    attempts = ledger.get("attempts", [])
    nodes = sorted({n for a in attempts for n in a["nodes"]}) or ["(no job)"]
    rows = {name: i for i, name in enumerate(nodes)}
    on = {a["attempt"]: a["nodes"] or nodes for a in attempts}
    box: list = []
    with _figure(box, figsize=(10, 1.0 + 0.55 * len(nodes))) as (_, ax):
        for span in ledger.get("spans", []):
            colour = COLOURS[PHASE_COLOUR.get(span["phase"], "other")]
            for name in on.get(span["attempt"], nodes):
                ax.broken_barh([(span["from"], span["to"] - span["from"])], (rows[name] - 0.3, 0.6), color=colour)
        for attempt in attempts:
            for name in attempt["nodes"] or nodes:
                _job_inside(ax, attempt, rows[name])
        shown: set[str] = set()
        for event in events:
            marker, colour = EVENT_MARK.get(event["event"], ("*", "black"))
            named = [n for n in nodes if n in event.get("detail", "").replace(",", " ").split()] or nodes
            label = event["event"] if event["event"] not in shown else None
            shown.add(event["event"])
            ax.scatter([event["t"]] * len(named), [rows[n] for n in named], marker=marker, color=colour, s=60,
                       zorder=3, label=label)
        ax.set_yticks(range(len(nodes)), nodes)
        ax.invert_yaxis()
        ax.set_xlim(0, max(ledger["wall_seconds"], 1e-3))
        ax.set_xlabel("seconds since the run began (coloured as the ledger; teal: a job's unmarked time)")
        if shown:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    return box[0]


def _job_inside(ax, attempt: dict, row: int) -> None:
    """An attempt's job as its marks tell it: start to the first step, training to the last, each checkpoint stall
    (at least a pixel wide), over the job's bar; what is left of the bar is the job's end (or all of it, unmarked)."""
    start = attempt["job"][0]
    if "first_step" in attempt:
        ax.broken_barh([(start, attempt["first_step"] - start)], (row - 0.3, 0.6), color=COLOURS["start"])
        ax.broken_barh([(attempt["first_step"], attempt["last_step"] - attempt["first_step"])], (row - 0.3, 0.6),
                       color=COLOURS["training"])
    for at, until in attempt.get("restarts", ()):  # the job restarted inside the attempt: not training
        ax.broken_barh([(at, until - at)], (row - 0.3, 0.6), color=COLOURS["recovery"])
    for at, seconds, _kind in attempt["checkpoints"]:
        ax.broken_barh([(at, seconds)], (row - 0.3, 0.6), color=COLOURS["checkpoint"], linewidth=1.5,
                       edgecolor=COLOURS["checkpoint"])


def loss_accuracy(rows: list[dict]) -> bytes:
    """Training and validation loss per epoch, validation accuracy on the right axis."""
    box: list = []
    epochs = [r["epoch"] + 1 for r in rows]
    with _figure(box, figsize=(7, 3.6)) as (_, ax):
        ax.plot(epochs, [r.get("loss") for r in rows], marker="o", label="training loss")
        ax.plot(epochs, [r.get("val_loss") for r in rows], marker="o", label="validation loss")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        if any(r.get("val_accuracy") is not None for r in rows):
            right = ax.twinx()
            right.plot(epochs, [r.get("val_accuracy") for r in rows], color="#43a047", marker="s",
                       label="validation accuracy")
            right.set_ylabel("accuracy")
            right.legend(loc="center right", fontsize=8)
        ax.legend(loc="upper right", fontsize=8)
    return box[0]


def step_time_per_rank(rows: list[dict]) -> bytes:
    """Each rank's median step time per epoch (a straggler's line stands above the others')."""
    box: list = []
    epochs = [r["epoch"] + 1 for r in rows]
    ranks = max((len(r.get("step_time_by_rank") or [r.get("step_time_s")]) for r in rows), default=1)
    with _figure(box, figsize=(7, 3.6)) as (_, ax):
        for rank in range(ranks):
            values = [_rank_value(r, rank) for r in rows]
            ax.plot(epochs, [v * 1000 if v is not None else None for v in values], marker=".", label=f"rank {rank}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("median step time (ms)")
        ax.legend(fontsize=8, ncol=max(1, ranks // 8))
    return box[0]


def throughput(rows: list[dict]) -> bytes:
    """Samples per second per epoch, across every rank."""
    box: list = []
    with _figure(box, figsize=(7, 3.6)) as (_, ax):
        ax.plot([r["epoch"] + 1 for r in rows], [r.get("samples_per_s") for r in rows], marker="o", color="#1e88e5")
        ax.set_xlabel("epoch")
        ax.set_ylabel("samples / s (all ranks)")
        ax.set_ylim(bottom=0)
    return box[0]


def _rank_value(row: dict, rank: int) -> float | None:
    by_rank = row.get("step_time_by_rank")
    if by_rank:
        return by_rank[rank] if rank < len(by_rank) else None
    return row.get("step_time_s") if rank == 0 else None  # a run from before per-rank times: rank 0's


def compute_per_rank(ledger: dict, named: list[dict]) -> bytes:
    """Each rank's compute per step-time window (its step less its communication: a rank that holds the others back
    computes longest, every step waits for it) against the optimizer step, every attempt; the ranks ``named``
    (``{"rank", "node", "why"}``: named slow, or holding steps back in the ledger) drawn thick, in red, and
    labelled with why."""
    box: list = []
    marked = {(n["rank"], n["node"]): n["why"] for n in named}
    with _figure(box, figsize=(10, 3.8)) as (_, ax):
        labelled: set[tuple[int, str]] = set()
        for attempt in ledger.get("attempts", []):
            lines = (attempt.get("compute") or {}).items()  # "rank" in each since the windows say their step
            for rank, line in sorted(((line.get("rank", k), line) for k, line in lines),
                                     key=lambda kv: (int(kv[0]), kv[1]["node"], kv[1]["step"][:1])):
                key = (int(rank), line["node"])
                why = marked.get(key)
                label = None if key in labelled else f"rank {rank} on {line['node']}" + (f": {why}" if why else "")
                labelled.add(key)
                ax.plot(line["step"], line["compute_ms"], marker="." if why else None, linewidth=2.5 if why else 1,
                        color="#d32f2f" if why else None, alpha=1.0 if why else 0.6, label=label,
                        zorder=3 if why else 2)
        ax.set_xlabel("optimizer step (each point: a window of steps, at its end)")
        ax.set_ylabel("compute per step (ms, median)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    return box[0]
