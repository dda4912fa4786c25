"""The control-plane benchmark's pure parts: phase medians, judging, the page section, the pdsh line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench import control_plane as cp
from bench import report
from bench.nodes import LocalCluster


def _samples(ours: list[float], pdsh: list[float], phases: list[dict] | None = None) -> dict:
    phases = phases or [{}] * len(ours)
    return {"ours": [{"exited_s": s, "peak_mib": 50.0 + i, "phases": p} for i, (s, p) in enumerate(zip(ours, phases))],
            "pdsh": [{"exited_s": s} for s in pdsh]}


def _row(ours: float, pdsh: float, phases: dict | None = None) -> dict:
    return {"up_s": 1.5, "down_s": 0.5, "ours_s": ours, "pdsh_s": pdsh, "ours_over_pdsh": ours / pdsh,
            "peak_mib": 51.0, "phases": phases or {}}


def _result() -> dict:
    phases16 = [{"connect": 1.0, "preflight": 2.0, "run": 3.0}, {"connect": 3.0, "preflight": 1.0, "run": 1.0},
                {"connect": 2.0, "preflight": 4.0, "run": 2.0, "sweep": 0.5}]
    result = {
        "sizes": [8, 16, 32], "repeats": 3, "judged": cp.judged_sizes([8, 16, 32]),
        "rows": {"8": _row(4.0, 5.0), "16": _row(6.0, 5.0, cp.phase_medians(_samples([1, 1, 1], [1, 1, 1], phases16)["ours"])),
                 "32": _row(7.0, 8.0)},
        "samples": {"8": _samples([4.0, 4.0, 4.0], [5.0, 5.0, 5.0]), "16": _samples([6.0, 4.0, 6.0], [5.0, 5.0, 5.0]),
                    "32": _samples([7.0, 9.0, 7.0], [8.0, 8.0, 8.0])},
    }
    result["target"] = cp.TARGET
    return result


def test_phase_medians_keep_first_seen_order_and_skip_runs_without_a_phase():
    samples = [{"phases": {"connect": 1.0, "run": 5.0}}, {"phases": {"connect": 3.0, "sync": 2.0, "run": 1.0}},
               {"phases": {}}, {}]
    medians = cp.phase_medians(samples)
    assert list(medians) == ["connect", "run", "sync"]
    assert medians == {"connect": 2.0, "run": 3.0, "sync": 2.0}
    assert cp.phase_medians([{"phases": {}}, {}]) == {}  # older orchestrators write no phases


def test_n8_is_shown_but_not_judged_and_quick_judges_its_largest_size():
    assert cp.judged_sizes([8, 16, 32, 64]) == [16, 32, 64]
    assert cp.judged_sizes([2, 4]) == [4]


def test_judge_takes_the_median_of_the_interleaved_rounds():
    verdicts = cp.judge(_result())
    assert [v["claim"].split(",")[0] for v in verdicts] == ["control plane N=16", "control plane N=32"]
    n16, n32 = verdicts
    assert n16["value"] == 6.0 / 5.0 and n16["verdict"] == "inconclusive" and n16["met_in"] == "1 of 3 rounds"
    assert [r["value"] for r in n16["runs"]] == [6.0 / 5.0, 4.0 / 5.0, 6.0 / 5.0]
    assert n32["value"] == 7.0 / 8.0 and n32["verdict"] == "inconclusive" and n32["met_in"] == "2 of 3 rounds"
    assert n16["target"] == "<= 1"


def test_section_table_phases_and_verdicts():
    text = cp.section(_result())
    assert text.startswith("## Control plane at scale")
    assert "| nodes | up (s) | ours (s) | pdsh (s) | ours / pdsh | peak (MiB) | down (s) |" in text
    assert "| 8 | 1.50 | 4.00 | 5.00 | **0.80** | 51 | 0.50 |" in text
    assert "| 16 | 1.50 | 6.00 | 5.00 | **1.20** | 51 | 0.50 |" in text
    assert "| nodes | connect | preflight | run | sweep |" in text
    assert "| 16 | 2.00 | 2.00 | 2.00 | 0.50 |" in text and "| 8 | - | - | - | - |" in text
    assert "- control plane N=16, ours / pdsh (trivial job, median of rounds, exited): **1.20 (target <= 1): inconclusive" in text
    assert "N=8," not in text  # not judged


def test_section_shows_the_session_rounds_when_every_row_has_them():
    result = _result()
    assert "Why one shell per node" not in cp.section(result)  # results measured before the rounds existed
    for n in result["sizes"]:
        result["rows"][str(n)].update(session_round_s=0.15 * n + 0.05, shell_round_s=0.0007 * n + 0.0011)
    text = cp.section(result)
    assert "| nodes | new session per node (s) | persistent shell (s) |" in text
    assert "| 8 | 1.25 | 0.007 |" in text and "| 16 | 2.45 | 0.012 |" in text


def test_section_without_phases_has_no_phase_table():
    result = _result()
    result["rows"]["16"]["phases"] = {}
    assert "per phase" not in cp.section(result)


def test_page_places_the_section_after_launch():
    from test_bench import MACHINE

    data = {"control_plane": {"quick": True, "machine": MACHINE, "result": _result()}}
    page = report.page(data)
    assert "## Control plane at scale" in page and "QUICK mode" in page
    assert report.ORDER.index("launch") < report.ORDER.index("control_plane")


def test_ranks_printed_reads_prefixed_lines_of_the_right_world_size():
    text = "[node-1] [rank1]: TRIVIAL 1 4\n10.0.0.10: TRIVIAL 0 4\nTRIVIAL 2 3\n"
    assert cp.ranks_printed(text, 4) == {0, 1}


def test_pdsh_line_runs_the_synced_job_on_every_node(make_inv):
    inv = replace(make_inv(3), extra={"namespaces": [f"mn-dev-{i}" for i in range(3)]})
    plane = cp.ControlPlane(LocalCluster("dev", home=Path("/state"), nodes=3, _inventory=inv))
    argv = plane.pdsh()
    assert argv[:9] == ["pdsh", "-S", "-R", "ssh", "-f", "64", "-l", "root", "-w"]
    assert argv[9] == "10.200.7.10,10.200.7.11,10.200.7.12"
    assert argv[10].startswith("cd /state/dev/nodes/node-$(( $(hostname | sed 's/.*-//') ))/code/project && ")
    assert argv[10].endswith("RANK=%n WORLD_SIZE=3 /repo/.venv/bin/python trivial.py")
    assert "-i /state/dev/id_ed25519" in plane.env("pdsh")["PDSH_SSH_ARGS_APPEND"]
    assert "PDSH_SSH_ARGS_APPEND" not in plane.env("ours")
    assert plane.ours()[-4:] == ["--nodes", "3", "--script", str(cp.JOB)]


def test_section_compares_the_session_round_with_one_node_alone_and_shows_the_connection_table():
    result = _result()
    result["cores"] = 2
    for n in result["sizes"]:
        result["rows"][str(n)].update(session_round_s=0.15 * n, shell_round_s=0.001, session_alone_s=0.1,
                                      connect_plain_ms=100.0, connect_ours_ms=20.0)
    text = cp.section(result)
    assert "| nodes | new session per node (s) | persistent shell (s) | one node alone (s) | N x alone / cores (s) |" in text
    assert "| 16 | 2.40 | 0.001 | 0.100 | 0.80 |" in text  # 16 x 0.1 / 2 cores
    assert "| 16 | 100.0 | 20.0 |" in text and "paramiko's socket (ms)" in text
