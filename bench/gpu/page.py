"""``python -m bench.gpu.page OUT/gpu.json [--docs docs]``: docs/gpu.md from the GPU check's JSON, and the JSON
copied beside it as docs/gpu.json (without the run's scratch paths), so the page can be made again from it.

:func:`render` is pure: every figure on the page is read from the JSON (the machine, the verdicts of
:mod:`bench.gpu.verdicts`, each call of the regroup probe, the timings); the only other input is the torch pin of
pyproject.toml, to say whether the torch that ran is the one the project ships.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bench.gpu import verdicts

REPO = Path(__file__).resolve().parents[2]
SCRATCH_KEYS = ("final_model",)  # paths on the machine that ran the check: meaningless here
CHECKOUT = re.compile(r"(?:/[^\s/\"']+)+/(?=(?:bench|training|scripts)/)")  # ".../checkout/" before our files


def pinned_torch(pyproject: str) -> str | None:
    match = re.search(r'"torch==([^"]+)"', pyproject)
    return match[1] if match else None


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _verdict(ok: bool | str | None) -> str:
    return {True: "pass", False: "**FAIL**", None: "n/a", "record": "on record"}[ok]


def machine_lines(data: dict, pin: str | None) -> list[str]:
    m = data["machine"]
    mpi = m.get("mpi") or {}
    rows = []
    if data["mode"] == "cuda":
        rows += [["GPU", f"{m.get('gpu')} x{m.get('gpus')} (compute capability {m.get('capability')}, "
                         f"{m.get('gpu_memory_gib')} GiB, {m.get('multiprocessors')} multiprocessors)"],
                 ["driver", f"{m.get('driver')} (nvidia-smi: {m.get('smi_name')}, {m.get('smi_memory')})"],
                 ["CUDA (torch's)", m.get("torch_cuda")], ["NCCL", m.get("nccl")], ["cuDNN", m.get("cudnn")],
                 ["torch built for", ", ".join(m.get("arch_list") or [])]]
    same = pin is not None and m.get("torch", "").split("+")[0] == pin
    rows += [["torch", f"{m.get('torch')}" + ("" if same else f" -- the machine's own build, not the {pin} that "
                                                                 "pyproject.toml pins" if pin else "")],
             ["Python", m.get("python")], ["CPU", f"{m.get('cpu')}, {m.get('cpu_cores')} cores"],
             ["kernel", m.get("kernel")],
             ["MPI", f"{mpi.get('library')} ({mpi.get('source')}); mpi4py {m.get('mpi4py')}" if mpi else "none"]]
    return _table(["", ""], rows)


def regroup_lines(data: dict) -> list[str]:
    lines = []
    apis = next((r.get("apis") for r in data["regroup"].values() if r.get("apis")), None)
    if apis:
        lines += ["Which of the calls this torch has:", ""]
        lines += _table(["call", "present"], [[k, v] for k, v in apis.items() if "." in k])
        lines.append("")
    for leave, record in data["regroup"].items():
        steps = (record.get("result") or {}).get("steps") or record.get("steps") or []
        lines += [f"Left by `{leave}` (exit {record.get('exit')}):", ""]
        lines += _table(["step", "outcome", "in the verdict", "seconds"],
                        [[s["step"], verdicts.outcome(s), "no (on record)" if s.get("informative") else "yes",
                          s["seconds"]] for s in steps])
        lines.append("")
    return lines


TIMEOUT_KEYS = ("leave_first", "raised", "error", "lost_peer", "step_at_error", "seconds_after_fault", "hold_s", "timeout_s",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "process_alive",
                "state_equals_kept")


def _said(run: dict) -> dict:
    """A fault run's record, or what its first STEP line said if it ended before its last line."""
    first = next((s for s in run.get("steps", []) if s.get("step") == "train until the fault"), {})
    return run.get("record") or first


FAULT_RUNS = {"fault": "trainer's settings, leave by destroy first", "fault_abort": "trainer's settings, leave by "
              "abort first", "torch_dump_wait": "baseline: torch's dump wait"}


def timeout_lines(data: dict) -> list[str]:
    present = {kind: data["timeout"][kind] for kind in FAULT_RUNS if data["timeout"].get(kind)}
    said = {kind: _said(run) for kind, run in present.items()}
    lines = _table(["what", *(FAULT_RUNS[k] for k in present)],
                   [[key, *(said[k].get(key) for k in present)] for key in TIMEOUT_KEYS
                    if any(key in said[k] for k in present)])
    for kind, run in present.items():
        steps = [s for s in (run.get("record") or {}).get("steps") or run.get("steps", []) if "ok" in s]
        if steps:
            lines += ["", f"Then, in the same process ({FAULT_RUNS[kind]}):", ""]
            lines += _table(["step", "outcome", "seconds"], [[s["step"], verdicts.outcome(s), s["seconds"]]
                                                             for s in steps])
    return lines


def timing_lines(data: dict) -> list[str]:
    timing = data.get("timing") or {}
    lines = []
    if timing.get("pairs"):
        lines += [f"`train.py {' '.join(timing['args'])}` (per epoch: the median step; the last epoch's figures), "
                  "CPU and GPU alternately:", ""]
        lines += _table(["pair", "CPU step (ms)", "GPU step (ms)", "CPU samples/s", "GPU samples/s"],
                        [[i + 1, _ms(p["cpu"]["step_time_s"]), _ms(p["gpu"]["step_time_s"]), p["cpu"]["samples_per_s"],
                          p["gpu"]["samples_per_s"]] for i, p in enumerate(timing["pairs"])])
        lines.append("")
    sweep = data.get("allreduce") or {}
    if sweep.get("rows"):
        lines += [f"`training/allreduce_perf.py --backend {sweep['backend']}` at world size 1 (one GPU: no byte "
                  "crosses a link, so the bus bandwidth, algbw x 2(n-1)/n, is 0 by definition):", ""]
        lines += _table(["bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
                        [[r["bytes"], f"{r['time_s'] * 1e6:.1f}", f"{r['algbw_gbs']:.2f}", f"{r['busbw_gbs']:g}"]
                         for r in sweep["rows"]])
    return lines


def _ms(seconds) -> str:
    return f"{seconds * 1000:.2f}" if isinstance(seconds, (int, float)) else "?"


def runs_lines(data: dict) -> list[str]:
    rows = []
    for name, run in data["train"].items():
        result = run.get("result") or {}
        acc = result.get("test_accuracy")
        rows.append([name, " ".join(run.get("args", [])), run.get("launcher"), run.get("exit"), run.get("seconds"),
                     f"{acc:.4f}" if acc is not None else "", result.get("data_plane", ""), result.get("amp", ""),
                     ", ".join(run.get("nondeterministic_ops") or []) or "none"])
    return _table(["run", "train.py arguments", "launcher", "exit", "seconds", "test accuracy", "data plane", "amp",
                   "ops torch warned have no deterministic implementation"], rows)


def render(data: dict, pin: str | None) -> str:
    rows = verdicts.rows(data)
    passed = sum(1 for r in rows if r["ok"] is True)
    failed = sum(1 for r in rows if r["ok"] is False)
    gpu = data["machine"].get("gpu") or "no GPU"
    lines = ["# GPU code paths on a real GPU", "",
             f"Generated by `python -m bench.gpu.page` from [gpu.json](gpu.json), the output of `{data['command']}` "
             f"on {gpu}, started {data['started']}, {data['seconds']} s. Every figure below is that run's; run the "
             "check again on any CUDA machine with `python -m bench.gpu --out OUT`, then this page with "
             "`python -m bench.gpu.page OUT/gpu.json`.", ""]
    if data["mode"] != "cuda":
        lines += ["**A CPU rehearsal (`--device cpu`): no figure on this page is a GPU's.**", ""]
    lines += ["## The machine", ""] + machine_lines(data, pin)
    lines += ["", f"## Verdicts: {passed} passed, {failed} failed, {len(rows) - passed - failed} not applicable or on "
              "record", ""]
    lines += ["A row *on record* shows what torch did, not a verdict on this code: the calls the survivors' path has to "
              "work around.", ""]
    lines += _table(["item", "check", "verdict", "figure"],
                    [[r["item"], r["check"], _verdict(r["ok"]), r["figure"]] for r in rows])
    lines += ["", "## NCCL at world size 1: a group left, a new one formed in the same process (item 2)", "",
              "The survivors of a lost node keep running only if they can leave the failed group and form a new one "
              "without a restart. `python -m bench.gpu.regroup` (one process per way of leaving):", ""]
    lines += regroup_lines(data)
    lines += ["## A collective made to time out under the trainer's NCCL error handling (item 6)", "",
              "`python -m bench.gpu.timeout --fault`: our Trainer over NCCL at world size 1; the CUDA stream a DDP "
              "all-reduce waits on is held past the process-group timeout (one GPU takes one NCCL rank, so no peer "
              "can be missing).", ""]
    lines += timeout_lines(data)
    lines += ["", "## Timings (item 5)", ""] + timing_lines(data)
    lines += ["", "## The train.py runs", ""] + runs_lines(data)
    return "\n".join(lines).rstrip() + "\n"


def published(data: dict) -> dict:
    """The JSON as docs/gpu.json keeps it: no path of the machine that ran the check (its final weights' files
    dropped, the checkout's place cut from the paths in its output, its --out and --work named OUT and WORK)."""
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in SCRATCH_KEYS}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return CHECKOUT.sub("", value) if isinstance(value, str) else value

    data = clean(data)
    data["command"] = re.sub(r"(--out|--work) \S+", lambda m: f"{m[1]} {m[1][2:].upper()}", data["command"])
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.page", description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="the check's gpu.json")
    parser.add_argument("--docs", type=Path, default=REPO / "docs")
    args = parser.parse_args(argv)
    try:
        data = published(json.loads(args.json.read_text()))
    except (OSError, ValueError) as err:
        print(f"bench.gpu.page: cannot read {args.json}: {err}; give the gpu.json that python -m bench.gpu wrote",
              file=sys.stderr)
        return 2
    pin = pinned_torch((REPO / "pyproject.toml").read_text())
    args.docs.mkdir(parents=True, exist_ok=True)
    (args.docs / "gpu.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (args.docs / "gpu.md").write_text(render(data, pin))
    print(f"wrote {args.docs / 'gpu.md'} and {args.docs / 'gpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
