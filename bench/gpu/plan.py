"""What the GPU check runs of ``training/train.py``, and how it reads their answers: pure, no process started.

Items (issue 49) and their runs, on ``--device gpu`` (``cpu`` in the rehearsal):

1. ``fp32``, ``bf16``, ``fp16``: digits to the end, each to reach :data:`ACCURACY`; ``resume_full`` (one run),
   ``resume_stopped`` (the same run stopped after an epoch, exit 3) and ``resume_resumed`` (its resume from that
   snapshot), all with ``--deterministic``: the resumed run's final weights must equal the full run's, bitwise;
2. ``gloo_ddp_2``: two ranks on the one GPU (``--spawn 2 --backend gloo``: NCCL refuses two ranks on one device),
   every rank's final weights the same;
3. ``mpi_plane_2``: ``mpirun -np 2`` with the MPI data plane (CUDA tensors staged through host memory unless the
   MPI library is CUDA-aware), compared with ``gloo_ddp_2``'s weights;
5. ``mlp_cpu_i`` / ``mlp_gpu_i``: the mlp workload's step time and samples/s, CPU and GPU in alternating pairs,
   read as the median of the pairs' ratios.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass

ACCURACY = 0.95  # digits' test accuracy every precision must reach (issue 49, item 1)
LAUNCHERS = ("python", "mpirun")
MLP_ARGS = ("--workload", "mlp", "--batch-size", "64", "--steps-per-epoch", "100", "2", "2")


@dataclass(frozen=True)
class TrainRun:
    """One ``train.py`` job: its own arguments (the metrics and snapshot directories are added per run)."""

    name: str
    args: tuple[str, ...]
    launcher: str = "python"  # python: one process (or --spawn N in args); mpirun: ``ranks`` processes
    ranks: int = 1
    expect_exit: int = 0  # 3: stopped on purpose by --stop-after-epoch
    snapshot_of: str | None = None  # resume from that run's snapshot directory (else a directory of its own)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if self.ranks < 1 or (self.launcher == "python" and self.ranks != 1):
            raise ValueError(f"run {self.name}: ranks={self.ranks} does not fit launcher {self.launcher}")


def train_flag(device: str) -> str:
    """train.py's ``--device`` value for the check's device (``cuda`` -> ``gpu``)."""
    return {"cuda": "gpu", "cpu": "cpu"}[device]


def correctness_runs(device: str, quick: bool = False) -> list[TrainRun]:
    """Items 1-3. ``quick``: fewer epochs (the CPU rehearsal; its accuracy means nothing)."""
    digits = ("--workload", "digits", "--device", train_flag(device))
    det = digits + ("--deterministic",)
    epochs = "2" if quick else "10"
    resume_epochs, stop_after = ("2", "0") if quick else ("4", "1")
    pair_epochs = "1" if quick else "4"
    return [
        TrainRun("fp32", digits + (epochs, epochs)),
        TrainRun("bf16", digits + ("--amp", "bf16", epochs, epochs)),
        TrainRun("fp16", digits + ("--amp", "fp16", epochs, epochs)),
        TrainRun("resume_full", det + (resume_epochs, "1")),
        TrainRun("resume_stopped", det + ("--stop-after-epoch", stop_after, resume_epochs, "1"), expect_exit=3),
        TrainRun("resume_resumed", det + (resume_epochs, "1"), snapshot_of="resume_stopped"),
        TrainRun("gloo_ddp_2", det + ("--spawn", "2", "--backend", "gloo", pair_epochs, pair_epochs)),
        TrainRun("mpi_plane_2", det + ("--backend", "gloo", "--data-plane", "mpi", pair_epochs, pair_epochs),
                 launcher="mpirun", ranks=2),
    ]


def timing_runs(device: str, pairs: int) -> list[TrainRun]:
    """Item 5: the mlp workload on the CPU, then on ``device``, ``pairs`` times (one run at a time)."""
    runs = []
    for i in range(1, pairs + 1):
        runs.append(TrainRun(f"mlp_cpu_{i}", ("--device", "cpu") + MLP_ARGS))
        runs.append(TrainRun(f"mlp_gpu_{i}", ("--device", train_flag(device)) + MLP_ARGS))
    return runs


def waits_for(run: TrainRun) -> str | None:
    """The run that must be done before ``run`` starts (a resume waits for the run it resumes)."""
    return run.snapshot_of


def argv(run: TrainRun, python: str, train_py: str, mpirun: tuple[str, ...] | None, metrics_dir: str,
         snapshot_dir: str) -> list[str]:
    """The command line of ``run``; ``mpirun``: the MPI launcher's argv prefix (None: no MPI runtime here)."""
    own = [train_py, *run.args, "--metrics-dir", metrics_dir, "--snapshot-dir", snapshot_dir]
    if run.launcher == "mpirun":
        if mpirun is None:
            raise ValueError(f"run {run.name} needs mpirun, and no MPI runtime was found")
        return [*mpirun, "-np", str(run.ranks), python, *own]
    return [python, *own]


def markers(output: str, name: str) -> list[dict]:
    """Every ``NAME {json}`` line of a run's output, in order (train.py's RESULT and RESUMED, the checks' own)."""
    found = []
    for line in output.splitlines():
        match = re.match(rf"^(?:\[[^\]]*\]\s*)?{re.escape(name)} (\{{.*\}})\s*$", line.strip())
        if match:
            found.append(json.loads(match[1]))
    return found


def marker(output: str, name: str) -> dict | None:
    """The last ``NAME {json}`` line of a run's output."""
    found = markers(output, name)
    return found[-1] if found else None


def last_epoch(metrics_jsonl: str) -> dict | None:
    """The last epoch line of a ``metrics.jsonl`` (lines with an ``epoch``; the test line has none)."""
    rows = [json.loads(line) for line in metrics_jsonl.splitlines() if line.strip()]
    epochs = [row for row in rows if "epoch" in row]
    return epochs[-1] if epochs else None


def median_ratio(pairs: list[tuple[float, float]]) -> float | None:
    """The median of ``a / b`` over paired measurements (a baseline and its alternative measured side by side)."""
    ratios = [a / b for a, b in pairs if a and b]
    return statistics.median(ratios) if ratios else None
