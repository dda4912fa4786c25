"""The GPU check's executor: processes with a deadline, the train.py runs of :mod:`bench.gpu.plan` (a few at a
time, a resume after the run it resumes), what each answered (RESULT, RESUMED, its last epoch, its grad scaler, its
final weights), two runs' final weights compared, and the all-reduce sweep of ``training/allreduce_perf.py``.

Every process starts in a session of its own, so a deadline ends it with everything it started (mpirun's ranks,
--spawn's children). A run's whole output goes to the check's log; its record keeps the last lines.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.gpu import plan

TAIL = 15  # lines of a run's output kept in its record


@dataclass(frozen=True)
class Context:
    repo: Path  # the checkout: training/ and bench/ under it
    work: Path  # scratch: a directory per run
    device: str  # cuda | cpu
    mpi: dict | None  # machine.mpi_launcher's answer
    log: Callable[[str], None]  # one progress line
    transcript: Callable[[str, str], None]  # (name, a process's whole output) into the log
    deadline: float  # time.monotonic() by which every process must have ended (the check's budget)
    threads: int = 2  # OMP_NUM_THREADS of the correctness runs (several run at once)


@dataclass(frozen=True)
class Finished:
    exit: int | None  # None: ended by its deadline
    seconds: float
    output: str


def environment(ctx: Context, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment: unbuffered, our packages importable, gloo and NCCL on loopback (every rank is on this
    machine, whose hostname need not resolve), and ``extra``."""
    env = dict(os.environ)
    path = [str(ctx.repo), str(ctx.repo / "scripts"), env.get("PYTHONPATH", "")]
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in path if p), GLOO_SOCKET_IFNAME="lo",
               NCCL_SOCKET_IFNAME="lo")
    env.update(extra or {})
    return env


def process(name: str, argv: list[str], ctx: Context, timeout: float, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Finished:
    """Run ``argv`` to its end or its deadline (``timeout``, or the check's budget if sooner: then its whole
    session is killed); output to the log."""
    start = time.monotonic()
    timeout = max(1.0, min(timeout, ctx.deadline - start))
    proc = subprocess.Popen(argv, cwd=cwd or ctx.repo, env=env or environment(ctx), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    seconds = round(time.monotonic() - start, 1)
    ctx.transcript(name, output)
    ctx.log(f"{name}: {f'deadline ({timeout:.0f} s)' if code is None else f'exit {code}'} in {seconds} s")
    return Finished(code, seconds, output)


def tail(output: str) -> list[str]:
    return output.strip().splitlines()[-TAIL:]


def nondeterministic_ops(output: str) -> list[str]:
    """The ops torch warned about under ``--deterministic`` (``warn_only``): "<op> does not have a deterministic
    implementation"."""
    return sorted(set(re.findall(r"(\w+) does not have a deterministic implementation", output)))


def scaler_state(snapshot_dir: Path) -> dict | None:
    """The grad scaler in the freshest snapshot of ``snapshot_dir`` (``{}``: the scaler was off)."""
    from training import snapshot

    blob = snapshot.read(snapshot_dir)
    if blob is None:
        return None
    state = snapshot.decode(blob).get("scaler") or {}
    return {k: float(v) for k, v in state.items() if isinstance(v, (int, float))}


def run_train(run: plan.TrainRun, ctx: Context, timeout: float, threads: int | None = None) -> dict:
    """One train.py run; its record."""
    metrics = ctx.work / run.name / "metrics"
    snapshots = ctx.work / (run.snapshot_of or run.name) / "snapshots"
    launcher = ctx.mpi["argv"] if ctx.mpi else None
    try:
        argv = plan.argv(run, sys.executable, str(ctx.repo / "training" / "train.py"), launcher, str(metrics),
                         str(snapshots))
    except ValueError as err:
        return {"exit": None, "not_run": str(err)}
    extra = dict(ctx.mpi["env"]) if run.launcher == "mpirun" and ctx.mpi else {}
    if threads:
        extra["OMP_NUM_THREADS"] = str(threads)
    done = process(run.name, argv, ctx, timeout, environment(ctx, extra))
    metrics_file = metrics / "metrics.jsonl"
    final = metrics / "final_model.pt"
    return {"exit": done.exit, "expected_exit": run.expect_exit, "seconds": done.seconds, "args": list(run.args),
            "launcher": run.launcher, "ranks": run.ranks,
            "result": plan.marker(done.output, "RESULT"), "resumed": plan.marker(done.output, "RESUMED"),
            "last_epoch": plan.last_epoch(metrics_file.read_text()) if metrics_file.is_file() else None,
            "scaler": scaler_state(snapshots), "final_model": str(final) if final.is_file() else None,
            "nondeterministic_ops": nondeterministic_ops(done.output), "tail": tail(done.output)}


def waves(tasks: dict[str, Callable[[], dict]], after: dict[str, str], jobs: int) -> dict[str, dict]:
    """Every task, ``jobs`` at a time, in order; a task named in ``after`` (task -> the task it waits for) starts
    once that one is done. A task that raises is recorded as such (the others go on)."""
    def guarded(name: str) -> dict:
        try:
            return tasks[name]()
        except Exception as err:  # a defect of the check itself: on record, the other tasks go on
            import traceback

            return {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc().splitlines()[-6:]}

    records: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running = {pool.submit(guarded, name): name for name in tasks if name not in after}
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                records[name] = future.result()
                running.update({pool.submit(guarded, n): n for n, first in after.items() if first == name})
    return {name: records[name] for name in tasks if name in records}


def compare_weights(a: str | None, b: str | None) -> dict:
    """Two saved state dicts: bitwise equal, and the largest absolute difference of any element."""
    import torch

    if not a or not b:
        return {"error": "a run saved no final weights"}
    left, right = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    if left.keys() != right.keys():
        return {"error": "the state dicts hold different tensors"}
    bitwise = all(torch.equal(left[k], right[k]) for k in left)
    diff = max(float((left[k].double() - right[k].double()).abs().max()) if left[k].numel() else 0.0 for k in left)
    return {"bitwise": bitwise, "max_abs_diff": diff, "tensors": len(left)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce(ctx: Context, timeout: float, sizes: str, budget_mb: int) -> dict:
    """``training/allreduce_perf.py`` at world size 1 (NCCL on cuda:0, or gloo on the CPU): its rows."""
    backend = "nccl" if ctx.device == "cuda" else "gloo"
    env = environment(ctx, {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(free_port())})
    argv = [sys.executable, str(ctx.repo / "training" / "allreduce_perf.py"), "--backend", backend, "--sizes", sizes,
            "--budget-mb", str(budget_mb)]
    done = process(f"allreduce_{backend}", argv, ctx, timeout, env)
    import json

    rows = [json.loads(line.split(" ", 1)[1]) for line in done.output.splitlines() if line.startswith("ALLREDUCE {")]
    return {"backend": backend, "exit": done.exit, "rows": rows, "tail": tail(done.output) if done.exit else []}


def child(module: str, args: list[str], ctx: Context, timeout: float, name: str | None = None) -> Finished:
    """One of the check's own probes (``python -m bench.gpu.<module>``)."""
    return process(name or module, [sys.executable, "-m", f"bench.gpu.{module}", *args], ctx, timeout)
