"""docs/reliability.md: the drills' results as tables, under where and on what they were measured (the machine, the
commit, the load as the drills began and ended: ``bench.provenance``); a judged drill begun above the load limit is
"inconclusive (load)" (``bench.verdicts.loaded``), as a benchmark section is."""

from __future__ import annotations

import os

from bench.drills.common import PG_TIMEOUT
from bench.drills.crashes import DrillResult
from bench.drills.elastic import ELASTIC_EPOCHS, FAULT_AFTER_EPOCH, SAVE_EVERY, ElasticResult
from bench.drills.hangs import HANG_AFTER, HangResult, judge as hang_judge
from bench.drills.stragglers import FAIR_SHARE, StragglerResult, spread
from bench.provenance import load_flag, settled
from bench.verdicts import loaded, word


def provenance(where: dict) -> str:
    """The page's 'measured on' line from ``bench.provenance.machine()`` joined with ``began()``'s stamp."""
    flag = load_flag(where)
    return (f"Measured by `python -m bench.drills`, started {where.get('started', '?')}, on commit "
            f"{where.get('commit', 'not recorded')}, on {where.get('cpu', '?')} ({where.get('cores', os.cpu_count())} "
            f"cores), load average {where.get('load_avg_1m_at_start', '?')} as the drills began"
            + settled(where)
            + f" and {os.getloadavg()[0]:.1f} when the page was written" + (f". **Flagged: {flag}.**" if flag else "."))


def markdown(results: list[DrillResult], elastic: list[ElasticResult] = (), where: dict | None = None) -> str:
    lines = [
        "# Reliability drills",
        "",
        f"{provenance(where or {})} Local cluster of 3 nodes (network namespaces, sshd per node), torchrun c10d, gloo, process-group timeout "
        f"{PG_TIMEOUT} s, rendezvous read timeout 10 s, no restarts. The fault hits node-1 (or the orchestrator) "
        "after every node has done a few all_reduce steps; for the faults present before the job starts "
        "(sshd down, rendezvous unreachable) the seconds run from the command to its exit.",
        "",
        "| drill | exit | seconds to exit | first node named | processes left at exit | left after recovery "
        "| seconds until none left |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        at_exit = sum(len(v) for v in r.left_at_exit.values())
        after = sum(len(v) for v in r.left_after_recovery.values())
        gone = "-" if getattr(r, "seconds_left", None) is None else f"{r.seconds_left:.1f}"
        lines.append(f"| {r.name} | {r.exit_code} | {r.seconds_to_exit:.1f} | {r.first_named or '-'} | {at_exit} | "
                     f"{after} | {gone} |")
    lines += [
        "",
        "Seconds to exit run from the fault to the orchestrator's exit: detection, stopping every node, and",
        "(for a node that stopped answering) the bounded wait for its SSH session before it is dropped.",
        "A node cut off from the network cannot be reached to be stopped: the processes left at exit are its own",
        f"ranks, which end when their process-group timeout ({PG_TIMEOUT} s here) expires; 'seconds until none left'",
        "runs from the orchestrator's exit (the link is restored at once) until none was left.",
    ]
    if elastic:
        lines += [
            "",
            "## With restarts (elastic)",
            "",
            f"Our digits trainer on 3 nodes, `MAX_RESTARTS=1`, {ELASTIC_EPOCHS} epochs with a snapshot every "
            f"{SAVE_EVERY}; the fault hits node-1 once rank 0 has finished epoch {FAULT_AFTER_EPOCH}. A killed worker is "
            "restarted by its node's torchrun agent; a node that dies is started again by the orchestrator once it "
            "answers SSH (its peers' agents keep the rendezvous open), and every rank resumes from the freshest snapshot.",
            "",
            "| drill | exit | test accuracy | epochs done at fault | resumed from epoch | epochs lost (max "
            f"{SAVE_EVERY}) | seconds fault -> resumed | wall (s) | processes left |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in elastic:
            acc = "-" if r.test_accuracy is None else f"{r.test_accuracy:.4f}"
            lines.append(f"| {r.name} | {r.exit_code} | {acc} | {r.epochs_done_at_fault} | "
                         f"{'-' if r.resumed_from is None else r.resumed_from} | "
                         f"{'-' if r.epochs_lost is None else r.epochs_lost} | "
                         f"{'-' if r.seconds_to_resume is None else r.seconds_to_resume} | {r.wall_seconds} | "
                         f"{sum(len(v) for v in r.left_at_exit.values())} |")
    return "\n".join(lines) + "\n"


def hangs_markdown(results: list[HangResult], where: dict | None = None) -> str:
    if not results:
        return ""
    lines = [
        "",
        "## Hangs: naming the rank that stopped making progress",
        "",
        f"`tests/integration/jobs/user_hang.py` on 3 nodes (LAUNCHER=auto: static), process-group timeout "
        f"{PG_TIMEOUT} s unless the drill says otherwise, stall watchdog off unless it says STALL_TIMEOUT; rank 2 on "
        f"node-2 hangs after {HANG_AFTER} steps. When the first waiting rank times out (or the watchdog sees no output "
        "and no CPU time on any rank for STALL_TIMEOUT), the orchestrator captures every live rank (process state "
        "from /proc, py-spy stack, two looks half a second apart) before the gang-stop, and names the rank that is not "
        "waiting on its peers. Seconds run from the hang to the orchestrator's exit; the requirement is at most the "
        "detecting timeout + 10 s (20 s; 18 s with STALL_TIMEOUT=8). The failure drills above pay for the same "
        "capture before their gang-stop (one look when a node failed on its own, two otherwise): their seconds to "
        "exit include it.",
        "",
        "| drill | exit | seconds to exit | verdict (bench.verdicts) | node, rank named | capture (s) | processes left "
        "| root cause line |",
        "|---|---:|---:|---|---|---:|---:|---|",
    ]
    for r in results:
        left = sum(len(v) for v in r.left_at_exit.values())
        cause = r.root_cause.replace("|", "\\|")
        judged = hang_judge(r.name, r.seconds_to_exit)
        if load_flag(where or {}):
            judged = loaded(judged, load_flag(where or {}))
        lines.append(f"| {r.name} | {r.exit_code} | {r.seconds_to_exit:.1f} | {word(judged)} ({judged['target']}) | "
                     f"{r.named_node}, rank {r.named_rank} | "
                     f"{'-' if r.capture_seconds is None else r.capture_seconds} | {left} | {cause} |")
    return "\n".join(lines) + "\n"


def stragglers_markdown(results: list[StragglerResult]) -> str:
    """The straggler drills (bench.drills.stragglers), and the unthrottled spread the 1.5 threshold stands on."""
    if not results:
        return ""
    from multinode.diagnose.slowranks import RATIO, WINDOWS

    lines = ["", "## Stragglers: naming the slow rank", "",
             f"Our digits trainer on 3 nodes; from epoch 2 every rank's processes under a CPU quota of {FAIR_SHARE:g} "
             "of a core and node-2's at that over the slowdown (none: nothing throttled), until node-2's rank is named "
             f"or has printed its windows. A rank is named over {RATIO:g}x the others' compute in {WINDOWS} windows in "
             "a row (`multinode.diagnose.slowranks`).", "",
             "| slowdown | exit | windows per rank | named | rank 2's windows under the quota to its naming | "
             "highest ratio of a rank's window to the others' |", "|---|---:|---|---|---:|---:|"]
    for r in results:
        named = ", ".join(f"{s['node']} rank {s['rank']} ({s['ratio']}x)" for s in r.named or ()) or "nobody"
        counts = ", ".join(str(len(w)) for _, w in sorted(r.windows.items()))
        to_name = "-" if r.windows_to_name is None else str(r.windows_to_name)
        top = f"{max(r.ratios):.2f}" if r.ratios else "-"
        lines.append(f"| {'none' if r.slowdown is None else f'{r.slowdown:g}x'} | {r.exit_code} | {counts} | {named} | "
                     f"{to_name} | {top} |")
    quiet = spread(results)
    if quiet:
        held = quiet["in_a_row"]
        lines += ["", f"Unthrottled, {quiet['windows']} windows: a rank's compute against the others' median "
                  f"{quiet['median']:g} (median), {quiet['p95']:g} (95th percentile), {quiet['max']:g} (highest); "
                  + (f"fewer than {WINDOWS} windows a rank: the threshold is not judged." if held is None else
                     f"the highest a rank held for {WINDOWS} windows in a row, what naming it takes, {held:g}: the "
                     f"threshold {RATIO:g} is " + (f"{RATIO / held:.2f} times that." if RATIO > held
                                                    else "**not above it: a healthy rank could be named**."))]
    return "\n".join(lines) + "\n"
