"""Each item's verdict, read from the GPU check's JSON (pure): a row per check, ``ok`` True, False, None where the
check does not apply to this machine (a peer killed mid-step needs a second GPU), or "record" for what torch did that
the survivors' path must work around (no verdict on our code), and the figure it rests on.

The MPI data plane must give DDP's weights bitwise: docs/verification.md's contract (``torch.equal``, no tolerance,
2 ranks), here with CUDA tensors.
"""

from __future__ import annotations

from bench.gpu.plan import ACCURACY

AMP_DTYPE = {"fp32": "off", "bf16": "bfloat16", "fp16": "float16"}


def _row(item: str, check: str, ok: bool | str | None, figure: str) -> dict:
    return {"item": item, "check": check, "ok": ok, "figure": figure}


def _ran(record: dict | None) -> str | None:
    """Why a run gave no answer, or None when it did."""
    if not record:
        return "not run"
    if record.get("not_run") or record.get("error"):
        return record.get("not_run") or record.get("error")
    if record.get("exit") is None:
        return "ended by its deadline"
    return None


def _device_ok(data: dict, result: dict) -> bool:
    return result.get("device") == ("cuda" if data["mode"] == "cuda" else "cpu")


def precision_rows(data: dict) -> list[dict]:
    rows = []
    for name, dtype in AMP_DTYPE.items():
        run = data["train"].get(name)
        why = _ran(run)
        result = (run or {}).get("result") or {}
        if why or run["exit"] != 0 or not result:
            rows.append(_row("1", f"digits {name}", False, why or f"exit {run['exit']}: {' | '.join(run['tail'][-2:])}"))
            continue
        acc = result.get("test_accuracy", 0.0)
        ok = acc >= ACCURACY and _device_ok(data, result) and result.get("amp") == (dtype if data["mode"] == "cuda" else "off")
        figure = (f"test accuracy {acc:.4f} (test loss {result.get('test_loss', 0):.5f}) on {result.get('device')}, amp "
                  f"{result.get('amp')}, {result.get('epochs')} epochs")
        if name == "fp16":
            scaler = run.get("scaler") or {}
            ok = ok and ("scale" in scaler if data["mode"] == "cuda" else True)
            figure += f"; GradScaler scale {scaler['scale']:g} after {scaler.get('_growth_tracker', 0):g} steps since its last change" if "scale" in scaler else "; no GradScaler state"
        rows.append(_row("1", f"digits {name} >= {ACCURACY:.0%}", ok, figure + f" ({run['seconds']} s)"))
    return rows


def resume_rows(data: dict) -> list[dict]:
    t = data["train"]
    stopped, resumed = t.get("resume_stopped"), t.get("resume_resumed")
    why = _ran(stopped) or _ran(resumed) or _ran(t.get("resume_full"))
    same = data["compare"]["resume"]
    if why or "error" in same:
        return [_row("1", "snapshot + resume bitwise", False, why or same["error"])]
    at = resumed.get("resumed") or {}
    ok = stopped["exit"] == 3 and resumed["exit"] == 0 and bool(at) and same["bitwise"]
    return [_row("1", "snapshot + resume bitwise (--deterministic)", ok,
                 f"stopped after epoch {at.get('epoch')} (exit {stopped['exit']}), resumed there: final weights "
                 f"{'bitwise equal' if same['bitwise'] else 'differ'} to the uninterrupted run's (max |diff| "
                 f"{same['max_abs_diff']:g}, {same['tensors']} tensors)")]


def ranks_rows(data: dict) -> list[dict]:
    rows = []
    for item, name, plane in (("2", "gloo_ddp_2", "gloo-ddp"), ("3", "mpi_plane_2", "mpi4py-allreduce")):
        run = data["train"].get(name)
        why = _ran(run)
        result = (run or {}).get("result") or {}
        if why or run["exit"] != 0 or not result:
            rows.append(_row(item, name, False, why or f"exit {run['exit']}: {' | '.join(run['tail'][-2:])}"))
            continue
        ok = (result.get("world_size") == 2 and _device_ok(data, result) and result.get("ranks_weights_equal") is True
              and result.get("data_plane", "").startswith(plane))
        rows.append(_row(item, f"2 ranks on one device, {plane}: every rank's weights equal", ok,
                         f"data plane {result.get('data_plane')}, backend {result.get('backend')}, device "
                         f"{result.get('device')}, ranks' weights equal: {result.get('ranks_weights_equal')}, "
                         f"test accuracy {result.get('test_accuracy', 0):.4f}"))
    same = data["compare"]["mpi_vs_ddp"]
    rows.append(_row("3", "MPI data plane = DDP, bitwise (docs/verification.md)", bool(same.get("bitwise")),
                     same.get("error") or f"{'bitwise equal' if same['bitwise'] else 'differ'} (max |diff| "
                     f"{same['max_abs_diff']:g}, {same['tensors']} tensors)"))
    return rows


def outcome(step: dict) -> str:
    """What a probe's step did: returned, raised (what), or hung; and, for a step in the verdict, whether that was
    what it had to do."""
    error = step.get("error")
    did = ("hung: " + error if error.startswith("did not return") else f"raised ({error})") if error else "returned"
    if step.get("informative"):
        return did
    return "ok" if step["ok"] and not error else did if step["ok"] else f"FAILED: {did}"


def regroup_rows(data: dict) -> list[dict]:
    rows = []
    for leave, record in data["regroup"].items():
        result = record.get("result")
        steps = result["steps"] if result else record.get("steps", [])
        said = "; ".join(f"{s['step']}: {outcome(s)}" for s in steps)
        ok = bool(result and result["ok"])
        rows.append(_row("2", f"NCCL world size 1: init, all_reduce, leave by {leave}, a new group in the same process",
                         ok, said or _ran(record) or "no steps recorded"))
    return rows


def smoke_rows(data: dict) -> list[dict]:
    smoke = data.get("smoke") or {}
    if "answers" not in smoke:
        return [_row("4", "gpucheck on the device", False, _ran(smoke) or "not run")]
    passing, refusing = (smoke["answers"] + [{}, {}])[:2]
    answer = passing.get("answer") or {}
    cap = data["machine"].get("smi_compute_cap", "")
    want_arch = f"sm_{cap.replace('.', '')}" if cap else None
    ok = (passing.get("line") is None and answer.get("ok") is True and answer.get("arch") == want_arch
          and answer.get("arch") in answer.get("archs", []))
    rows = [_row("4", "gpucheck passes; its arch is the GPU's", ok,
                 f"NPROC=auto -> {smoke['nproc_auto']} (bootstrap count {smoke['bootstrap_gpus']}); answer ok="
                 f"{answer.get('ok')}, arch {answer.get('arch')} (nvidia-smi: compute capability {cap or '?'}), "
                 f"{answer.get('name')}, torch built for {', '.join(answer.get('archs', [])) or 'none'}"
                 + (f"; line: {passing['line']}" if passing.get("line") else ""))]
    refused = refusing.get("answer") or {}
    rows.append(_row("4", "gpucheck refuses one process more than GPUs", refused.get("error") == "too_many_procs"
                     and bool(refusing.get("line")), f"NPROC={refusing.get('want')}: {refusing.get('line')}"))
    return rows


def _nccl_env(record: dict) -> str:
    return ", ".join(f"{k}={record.get(k, '?')}" for k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                           "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"))


def timeout_rows(data: dict) -> list[dict]:
    fault = data["timeout"]["fault"]
    record = fault.get("record") or {}
    if not record:
        first = next((s for s in fault.get("steps", []) if s.get("step") == "train until the fault"), None)
        figure = _ran(fault) or f"exit {fault.get('exit')}"
        return [_row("6", "a collective timed out: raised in Python, process kept, state resumed", False,
                     f"{figure}; {first or ''} {' | '.join(fault.get('tail', [])[-3:])}")]
    kept = record.get("kept") or {}
    steps = {s["step"]: s for s in record.get("steps", [])}
    new = steps.get("a new group in the same process", {}).get("ok")
    same = data["compare"]["timeout_resume"]
    resumed = fault.get("resumed") or {}
    rows = [
        _row("6", "a timed-out collective raises in Python; the process is not torn down",
             bool(record.get("raised") and record.get("process_alive")),
             f"{record.get('error') or 'no error reached Python'} (step {record.get('step_at_error')}, "
             f"{record.get('seconds_after_fault')} s after the stream was held for {record.get('hold_s')} s; "
             f"process-group timeout {record.get('timeout_s')} s; {_nccl_env(record)}); survivor.lost_peer: "
             f"{record.get('lost_peer')}"),
        _row("6", "the state is readable and equals the survivor's snapshot", bool(
            steps.get("the model in memory is readable", {}).get("ok") and record.get("state_equals_kept")
            and kept.get("by_survivor_path")),
             f"kept by the survivor path: {kept.get('by_survivor_path')}, at step {kept.get('step')} (epoch "
             f"{kept.get('next_epoch')}, {kept.get('consumed')} samples of it); memory equals it: "
             f"{record.get('state_equals_kept')}"),
        _row("6", "after the watchdog's abort: a new group in the same process, resumed from the kept snapshot = "
             "uninterrupted run", bool(new and resumed.get("survivor") and same.get("bitwise")),
             f"new group: {new}; resumed at step {resumed.get('step')} from the survivor's snapshot: "
             f"{resumed.get('survivor')}; final weights "
             + (same.get("error") or f"{'bitwise equal' if same['bitwise'] else 'differ'} (max |diff| {same['max_abs_diff']:g})")),
    ]
    # What torch does when the survivor leaves the group the watchdog aborted: no verdict on our code, but the way the
    # survivors' path must take (the call is made where it may hang, the new group does not wait for it).
    for kind, first in (("fault", "destroy_process_group()"), ("fault_abort", "_abort_process_group()")):
        run = data["timeout"].get(kind) or {}
        tried = [s for s in (run.get("record") or {}).get("steps", []) if s["step"].startswith("leave")]
        if tried:
            rows.append(_row("6", f"on record: leaving the group the watchdog aborted, {first} first", "record",
                             "; ".join(f"{s['step'].removeprefix('leave the failed group: ')}: {outcome(s)}"
                                       for s in tried)))
    base = (data["timeout"].get("torch_dump_wait") or {}).get("record") or {}
    rows.append(_row("6", "seconds from the held stream to the error: the trainer's NCCL settings, then torch's dump "
                     "wait", bool(record.get("raised") and base.get("raised")),
                     f"{record.get('seconds_after_fault')} s ({_nccl_env(record)}); {base.get('seconds_after_fault')} s "
                     f"({_nccl_env(base)}: the watchdog sleeps 4 x 15000 ms before it aborts)" if base else
                     _ran(data["timeout"].get("torch_dump_wait")) or "the baseline did not run"))
    gpus = data["machine"].get("gpus", 0)
    rows.append(_row("6", "a peer killed mid-step (two GPUs or more)", None,
                     f"not applicable: this machine has {gpus} GPU" if gpus < 2 else
                     f"{gpus} GPUs, but this check has no two-GPU case yet"))
    return rows


def timing_rows(data: dict) -> list[dict]:
    timing = data.get("timing") or {}
    ratio = timing.get("cpu_over_gpu_step_time")
    if ratio is not None:
        figure = (f"{ratio:.2f}x the step time on the CPU, {timing['gpu_over_cpu_samples_per_s']:.2f}x the samples/s on "
                  f"the GPU, {len(timing['pairs'])} pairs")
    else:
        figure = timing.get("not_run", "no pair measured")
    rows = [_row("5", "mlp step time, CPU / GPU (median of paired ratios)", ratio is not None, figure)]
    sweep = data.get("allreduce") or {}
    top = (sweep.get("rows") or [None])[-1]
    if top:
        figure = (f"{top['bytes'] / 2**20:g} MiB: {top['time_s'] * 1e6:.1f} us, algbw {top['algbw_gbs']:.1f} GB/s, "
                  f"busbw {top['busbw_gbs']:g} GB/s (algbw x 2(n-1)/n: 0 at one rank)")
    else:
        figure = sweep.get("not_run", "no row measured")
    rows.append(_row("5", f"{sweep.get('backend', 'nccl')} all_reduce at world size 1", top is not None, figure))
    return rows


def rows(data: dict) -> list[dict]:
    """Every verdict, in the issue's order."""
    return (precision_rows(data) + resume_rows(data) + ranks_rows(data)[:1] + regroup_rows(data)
            + ranks_rows(data)[1:] + smoke_rows(data) + timing_rows(data) + timeout_rows(data))
