"""Control plane at scale (issue 13): a trivial job on N = 8, 16, 32, 64 nodes, ours vs pdsh.

    python -m bench.control_plane [--quick] [--out-dir docs]     (its own cluster per N; quick: N = 2, 4)

The job (``bench/jobs/trivial.py``) prints ``TRIVIAL <rank> <world size>`` and exits; no torch, so
a run's time is the control plane's own. Per N, on a fresh cluster of exactly N nodes:

* **up** / **down**: wall seconds of ``python -m multinode up --nodes N`` and of ``down``;
* **ours**: ``python -m multinode train --nodes N --script bench/jobs/trivial.py`` (default launcher):
  start-up, pre-flight, code sync, launch, line prefixes, the sweep and the summary;
* **pdsh**: ``pdsh -S -R ssh -f 64`` of ``cd <the node's synced project dir> && RANK=%n WORLD_SIZE=N
  <node python> trivial.py`` on every node, with the cluster's key and pinned host keys (the ssh options
  of bench/launch.py). It runs the code the orchestrator synced: a first, untimed *ours* run does the sync.

*ours* and *pdsh* are interleaved (order rotated each round); each cell is the median of the rounds'
"command to exit" seconds. Every run must exit 0 with all N ranks printed, else the section fails
with the output's tail. The orchestrator's peak memory is the ``ru_maxrss`` that ``os.wait4`` returns
for the CLI process, reaped by a small Python parent (MEASURE: reaped by this benchmark's own Python it would
carry that process's peak over the exec; Fabric runs in-process, so this is the CLI's own Python). The per-phase breakdown comes from each *ours* run's
``summary.json`` ``"phases"`` ({name: seconds}, in order), where the orchestrator writes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.control_plane_runs import JOB, ControlPlane, connection_rounds, ranks_printed, session_rounds  # noqa: F401
from bench.nodes import LocalCluster, bring_up, median
from bench.verdicts import Target, attach, describe, paired, shown

SIZES = (8, 16, 32, 64)
QUICK_SIZES = (2, 4)
JUDGED_FROM = 16  # N = 8 is shown, not judged (issue 13: "at N = 16, 32 and 64")
METHODS = ("ours", "pdsh")
NOT_SLOWER = Target("<=", 1.0)  # ours / pdsh, command to exit
LINK_CHECK = Target("<=", 1.0)  # seconds the link check adds to pre-flight (issue 24: at most 1 s at 16 nodes)
LINK_PHASE = "link check"  # its phase in summary.json
TARGET = (f"ours / pdsh (trivial job, command to exit) {NOT_SLOWER} at N = 16, 32, 64; the link check's seconds "
          f"{LINK_CHECK} at every N")


def phase_medians(samples: list[dict]) -> dict[str, float]:
    """{phase: median seconds} over the runs that report it, in the order the phases first appear."""
    names: list[str] = []
    for sample in samples:
        names += [name for name in (sample.get("phases") or {}) if name not in names]
    return {name: median(s["phases"][name] for s in samples if name in (s.get("phases") or {})) for name in names}


def judged_sizes(sizes: list[int]) -> list[int]:
    """N >= 16; a quick run (N = 2, 4) judges its largest N, so the judging path runs (its page says QUICK)."""
    return [n for n in sizes if n >= JUDGED_FROM] or [max(sizes)]


def measure_size(n: int, repeats: int) -> dict:
    """One fresh N-node cluster: up, a syncing warm-up run, ``repeats`` interleaved rounds, down (always)."""
    start = time.monotonic()
    cluster = bring_up(n, "cp")
    up_s = time.monotonic() - start
    print(f"control_plane: cluster {cluster.name} is up ({n} nodes, {up_s:.1f} s, MULTINODE_HOME={cluster.home})",
          flush=True)
    samples: dict[str, list[dict]] = {m: [] for m in METHODS}
    try:
        cp = ControlPlane(cluster)
        cp.measure("ours")  # syncs the job to the N nodes (pdsh runs that copy) and warms the page cache: not counted
        for rep in range(repeats):
            for method in METHODS[rep % 2:] + METHODS[:rep % 2]:  # rotate: neither always first
                samples[method].append(cp.measure(method))
        rounds = session_rounds(cluster, repeats)
        rounds.update(connection_rounds(cluster, max(repeats, 5)))
    finally:
        start = time.monotonic()
        cluster.down()
        down_s = time.monotonic() - start
        print(f"control_plane: cluster {cluster.name} is down ({down_s:.1f} s)", flush=True)
    ours, pdsh = (median(s["exited_s"] for s in samples[m]) for m in METHODS)
    row = {"up_s": up_s, "down_s": down_s, "ours_s": ours, "pdsh_s": pdsh, "ours_over_pdsh": median(round_ratios(samples)),
           "peak_mib": median(s["peak_mib"] for s in samples["ours"]), "phases": phase_medians(samples["ours"]),
           **rounds}
    return {"row": row, "samples": samples}


def run(cluster: LocalCluster | None = None, quick: bool = False, sizes: tuple[int, ...] | None = None,
        repeats: int | None = None) -> dict:
    """Every N on its own cluster (``cluster``, the shared one of the other sections, is not used)."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    repeats = repeats or (1 if quick else 3)
    rows, samples = {}, {}
    for n in sizes:
        measured = measure_size(n, repeats)
        rows[str(n)], samples[str(n)] = measured["row"], measured["samples"]
    result = {"sizes": list(sizes), "repeats": repeats, "judged": judged_sizes(list(sizes)), "rows": rows,
              "samples": samples, "cores": os.cpu_count()}
    return attach(result, judge(result), TARGET)


def round_ratios(samples: dict[str, list[dict]]) -> list[float]:
    """ours / pdsh (exited) of each interleaved round."""
    return [o["exited_s"] / p["exited_s"] for o, p in zip(samples["ours"], samples["pdsh"])]


def judge(result: dict) -> list[dict]:
    """At each judged N: ours / pdsh by the one rule (bench.verdicts.paired) on the interleaved rounds; at every N
    whose runs recorded it, the seconds the link check added to each of ours, by the same rule."""
    out = []
    for n in result["judged"]:
        rounds = [(f"round {i + 1}", r) for i, r in enumerate(round_ratios(result["samples"][str(n)]))]
        out.append(paired(f"control plane N={n}, ours / pdsh (trivial job, median of rounds, exited)", rounds,
                          NOT_SLOWER, "rounds"))
    for n in result["sizes"]:
        runs = [(f"run {i + 1}", s["phases"][LINK_PHASE]) for i, s in enumerate(result["samples"][str(n)]["ours"])
                if LINK_PHASE in s.get("phases", {})]
        if runs:
            out.append(paired(f"link check N={n}: seconds added to pre-flight (median of runs)", runs, LINK_CHECK,
                              "runs"))
    return out


def section(result: dict) -> str:
    lines = _main_table(result) + _sessions_table(result) + _connections_table(result) + _phases_table(result)
    lines += ["", f"Target: {result['target']}. Verdicts (computed by `bench.control_plane.judge`):", "",
              *(f"- {v['claim']}: **{describe(v)}**" for v in result.get("verdicts", judge(result)))]
    return "\n".join(lines) + "\n"


def _main_table(result: dict) -> list[str]:
    """The section's heading, what was measured, and up / ours / pdsh / peak / down per N."""
    from bench.report import md_table

    rows = []
    for n in result["sizes"]:
        r = result["rows"][str(n)]
        rows.append([str(n), f"{r['up_s']:.2f}", f"{r['ours_s']:.2f}", f"{r['pdsh_s']:.2f}",
                     f"**{shown(median(round_ratios(result['samples'][str(n)])), NOT_SLOWER)}**", f"{r['peak_mib']:.0f}",
                     f"{r['down_s']:.2f}"])
    return [
        "## Control plane at scale (trivial job)",
        "",
        f"`python -m bench.control_plane`: a fresh cluster of N nodes per row, one process per node, medians of "
        f"{result['repeats']} interleaved round{'s' if result['repeats'] != 1 else ''} (order rotated each round) after one untimed run that syncs the job. "
        "The job prints its rank and exits (no torch). *up* / *down*: `multinode up --nodes N` / `down`; *ours*: "
        "`multinode train --nodes N --script trivial.py` (default launcher), command to exit; *pdsh*: `pdsh -S -R ssh "
        "-f 64` of `cd <synced dir> && RANK=%n WORLD_SIZE=N python trivial.py` on the same nodes; *peak*: the "
        "orchestrator's peak RSS (`ru_maxrss` from `wait4`, in a small parent process).",
        "",
        md_table(["nodes", "up (s)", "ours (s)", "pdsh (s)", "ours / pdsh", "peak (MiB)", "down (s)"], rows),
    ]


def _sessions_table(result: dict) -> list[str]:
    """Session rounds vs persistent shells per N (and one node alone, where measured); none before they were."""
    from bench.report import md_table

    sizes = result["sizes"]
    if not all("session_round_s" in result["rows"][str(n)] for n in sizes):
        return []
    alone = all("session_alone_s" in result["rows"][str(n)] for n in sizes)  # measured since 2026-11-23
    cores = result.get("cores") or os.cpu_count() or 1
    cells = []
    for n in sizes:
        r = result["rows"][str(n)]
        cells.append([str(n), f"{r['session_round_s']:.2f}", f"{r['shell_round_s']:.3f}"]
                     + ([f"{r['session_alone_s']:.3f}", f"{n * r['session_alone_s'] / cores:.2f}"] if alone else []))
    text = ("Why one shell per node (`bench.control_plane.session_rounds`): one round of `true` on every node "
            "over open connections, each in a new SSH session (what one exec per command, Fabric's `run`, costs: "
            "the node's sshd starts the login shell and its rc files every time) and in the nodes' persistent "
            "shells")
    if alone:
        text += (f"; and one new session on node-0 alone, with N times that over this host's {cores} cores: what "
                 "N login shells at once take when they only share the cores (median seconds). A round of new "
                 "sessions well above that is login shells waiting for each other: with one home for every "
                 "node, root's `~/.bashrc` here (pyenv's initialisation, whose rehash holds a lock file in the "
                 "home) made them take turns; each local node now logs in to a copy-on-write home of its own "
                 "(`multinode.providers.local.home`), as separate machines do.")
    else:
        text += " (median seconds):"
    return ["", text, "", md_table(["nodes", "new session per node (s)", "persistent shell (s)"]
                                   + (["one node alone (s)", "N x alone / cores (s)"] if alone else []), cells)]


def _connections_table(result: dict) -> list[str]:
    """Paramiko's socket vs ours, milliseconds to an open session, per N; none before it was measured."""
    from bench.report import md_table

    sizes = result["sizes"]
    if not all("connect_plain_ms" in result["rows"][str(n)] for n in sizes):
        return []
    cells = [[str(n), f"{result['rows'][str(n)]['connect_plain_ms']:.1f}",
              f"{result['rows'][str(n)]['connect_ours_ms']:.1f}"] for n in sizes]
    return ["", "One connection, nothing to an open session on node-0 (`bench.control_plane.connection_rounds`, "
            "one at a time, median milliseconds): with paramiko's own socket, and as "
            "`multinode.ssh.connect.open_connection` opens it (TCP_NODELAY, quick ACKs re-armed after each read):", "",
            md_table(["nodes", "paramiko's socket (ms)", "ours (ms)"], cells)]


def _phases_table(result: dict) -> list[str]:
    """Median seconds per phase of *ours* per N, every phase any N reported; none when no run reported one."""
    from bench.report import md_table

    sizes = result["sizes"]
    phases: list[str] = []
    for n in sizes:
        phases += [p for p in result["rows"][str(n)]["phases"] if p not in phases]
    if not phases:
        return []
    cells = [[str(n), *(f"{result['rows'][str(n)]['phases'][p]:.2f}" if p in result["rows"][str(n)]["phases"]
                        else "-" for p in phases)] for n in sizes]
    return ["", "Where *ours* spends its time (median seconds per phase, from each run's `summary.json`):", "",
            md_table(["nodes", *phases], cells)]


def plot(result: dict, out_dir) -> list:
    from bench.report import lines_by_nodes

    sizes = result["sizes"]
    series = {"ours (train, command to exit)": "ours_s", "pdsh (command to exit)": "pdsh_s", "multinode up": "up_s"}
    return lines_by_nodes(Path(out_dir) / "control_plane.png", sizes,
                          {label: [result["rows"][str(n)][key] for n in sizes] for label, key in series.items()},
                          "seconds (median)", "control plane, trivial job")


if __name__ == "__main__":
    from bench.report import standalone

    standalone("control_plane", nodes=None, run=run, plot=plot)
