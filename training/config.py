"""Trainer configuration: a YAML file (``distributed`` and ``training`` sections) overridden by flags.

Validated once, before any process group exists: every bad value raises :class:`ConfigError`,
which ``train.py`` prints as one line (``train.py: error: ...``) and exits 2.

The seed scripts' command line keeps working: positional ``total_epochs save_every`` and
``--batch-size`` (per rank).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

WORKLOADS = ("digits", "mnist", "regression", "hello", "mlp")
STRATEGIES = ("auto", "single", "ddp")
BACKENDS = ("auto", "gloo", "nccl", "mpi")
DATA_PLANES = ("auto", "ddp", "mpi")
DEVICES = ("auto", "cpu", "gpu")
AMP = ("off", "auto", "bf16", "fp16")


class ConfigError(ValueError):
    """One line naming the bad value and the fix."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is a :class:`ConfigError` (one line, exit 2) instead of usage + message."""

    def error(self, message: str):
        raise ConfigError(f"{message}; see 'train.py --help'")


@dataclass(frozen=True)
class DistConfig:
    strategy: str = "auto"  # auto: ddp when the launcher started several processes, else single
    backend: str = "auto"  # auto: nccl on GPU, gloo on CPU (mpi when torch has it and MPI launched us)
    timeout: float = 30.0  # process-group timeout (s): a dead peer fails the job in seconds, not 30 min
    data_plane: str = "auto"  # auto: MPI allreduce under mpirun, DDP otherwise
    spawn: int = 0  # > 0: start this many ranks on this machine with torch.multiprocessing.spawn


@dataclass(frozen=True)
class TrainConfig:
    workload: str = "digits"
    total_epochs: int = 10
    save_every: int = 5
    batch_size: int = 32  # per rank: the largest micro-batch (a resume on fewer ranks accumulates more of them)
    lr: float | None = None  # None: the workload's default
    seed: int = 0
    grad_accum: int = 1
    amp: str = "off"  # GPU only; auto: bf16 where the GPU supports it, else fp16 with a GradScaler
    deterministic: bool = False  # deterministic algorithms where torch has them (train.make_deterministic)
    find_unused_parameters: bool = False
    patience: int = 0  # early stopping after this many epochs without val-loss improvement; 0 = off
    device: str = "auto"
    snapshot_dir: str | None = None
    metrics_dir: str | None = None
    log_samples: bool = False  # rank 0 writes <metrics dir>/samples.jsonl: every rank's sample ids of each step
    data_dir: str = "data"
    steps_per_epoch: int = 0  # mlp workload: synthetic steps per epoch (0 = default)
    stop_after_epoch: int = -1  # drills: every rank exits 3 right after this (0-based) epoch's snapshot
    crash_after_epoch: int = -1  # testing: SIGKILL the last rank right after this epoch's end (its periodic snapshot)
    min_step_seconds: float = 0.0  # drills: a step lasts at least this long (the rest asleep), as a bigger model's would
    min_sample_seconds: float = 0.0  # drills: a step lasts at least this long per sample of this rank's share of it
    # drills: SIGKILL rank 0 halfway through writing this epoch's snapshot (temp file written, not renamed);
    # only in a job's first attempt, so a torchrun restart runs on
    crash_during_snapshot: int = -1
    crash_before_join: str | None = None  # drills: a joining rank that makes this file first SIGKILLs itself (faults.py)

    def pace(self, samples: int) -> float:
        """The least seconds a step of this rank's ``samples`` lasts (a drill's pace; 0: none)."""
        return max(self.min_step_seconds, self.min_sample_seconds * samples)


@dataclass(frozen=True)
class Config:
    distributed: DistConfig
    training: TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="train.py", description="Data-parallel trainer (torchrun, mpirun, srun or one process).")
    p.add_argument("total_epochs", nargs="?", type=int, help="epochs to train (seed scripts' first positional)")
    p.add_argument("save_every", nargs="?", type=int, help="snapshot every N epochs")
    p.add_argument("--config", help="YAML file with 'distributed' and 'training' sections")
    p.add_argument("--workload", choices=None, help=f"one of {', '.join(WORKLOADS)}")
    p.add_argument("--batch-size", type=int, help="per-rank batch size (the largest micro-batch)")
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    p.add_argument("--amp", nargs="?", const="auto", help=f"one of {', '.join(AMP)} (GPU only; bare --amp = auto)")
    p.add_argument("--find-unused-parameters", action="store_const", const=True)
    p.add_argument("--deterministic", action="store_const", const=True,
                   help="deterministic algorithms (cuDNN, cuBLAS; an op without one warns), for a bitwise rerun or resume")
    p.add_argument("--patience", type=int, help="early stopping patience in epochs (0 = off)")
    p.add_argument("--device", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--snapshot-dir")
    p.add_argument("--metrics-dir")
    p.add_argument("--log-samples", action="store_const", const=True,
                   help="rank 0 writes <metrics dir>/samples.jsonl: every rank's sample ids of each optimizer step")
    p.add_argument("--data-dir")
    p.add_argument("--steps-per-epoch", type=int)
    p.add_argument("--stop-after-epoch", type=int, help="exit with code 3 right after this (0-based) epoch and its snapshot")
    p.add_argument("--crash-after-epoch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--crash-during-snapshot", type=int, help=argparse.SUPPRESS)
    p.add_argument("--crash-before-join", help=argparse.SUPPRESS)
    p.add_argument("--min-step-seconds", type=float, help="a drill's pace: every step lasts at least this long (asleep "
                   "for the rest), so a long drill trains for minutes without using the CPU for minutes")
    p.add_argument("--min-sample-seconds", type=float, help="a drill's pace by the work: every step lasts at least "
                   "this long per sample of this rank's share of it, so on fewer ranks (the same global batch) each "
                   "step takes longer, as a compute-bound model's would")
    p.add_argument("--strategy", help=f"one of {', '.join(STRATEGIES)}")
    p.add_argument("--backend", help=f"one of {', '.join(BACKENDS)}")
    p.add_argument("--timeout", type=float, help="process-group timeout in seconds")
    p.add_argument("--data-plane", help=f"one of {', '.join(DATA_PLANES)}")
    p.add_argument("--spawn", type=int, metavar="N",
                   help="run N ranks on this machine (torch.multiprocessing.spawn, no launcher)")
    return p


def _section(data: dict, name: str, cls: type) -> dict:
    section = data.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"config section '{name}' must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"unknown key '{unknown[0]}' in config section '{name}'; known keys: {', '.join(sorted(known))}")
    return section


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


def load(argv: list[str] | None = None) -> Config:
    args = build_parser().parse_args(argv)
    dist_kw: dict = {}
    train_kw: dict = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"--config {args.config} is not valid YAML: {str(err).splitlines()[0]}") from None
        dist_kw.update(_section(data, "distributed", DistConfig))
        train_kw.update(_section(data, "training", TrainConfig))
    for f in fields(DistConfig):
        if getattr(args, f.name, None) is not None:
            dist_kw[f.name] = getattr(args, f.name)
    for f in fields(TrainConfig):
        if getattr(args, f.name, None) is not None:
            train_kw[f.name] = getattr(args, f.name)
    try:
        cfg = Config(DistConfig(**dist_kw), TrainConfig(**train_kw))
    except TypeError as err:
        raise ConfigError(str(err)) from None
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    d, t = cfg.distributed, cfg.training
    _choice("strategy", d.strategy, STRATEGIES)
    _choice("backend", d.backend, BACKENDS)
    _choice("data_plane", d.data_plane, DATA_PLANES)
    _choice("workload", t.workload, WORKLOADS)
    _choice("device", t.device, DEVICES)
    _choice("amp", t.amp, AMP)
    for name in ("total_epochs", "save_every", "batch_size", "grad_accum"):
        if int(getattr(t, name)) < 1:
            raise ConfigError(f"{name.replace('_', '-')}={getattr(t, name)} must be at least 1")
    if d.spawn < 0:
        raise ConfigError(f"spawn={d.spawn} must be a number of ranks (1 or more), or 0 for no spawn")
    if not d.timeout > 0:
        raise ConfigError(f"timeout={d.timeout} must be a positive number of seconds")
    if t.lr is not None and t.lr <= 0:
        raise ConfigError(f"lr={t.lr} must be positive")
    if t.patience < 0:
        raise ConfigError(f"patience={t.patience} must be 0 (off) or more")
    for name in ("min_step_seconds", "min_sample_seconds"):
        if not getattr(t, name) >= 0:
            raise ConfigError(f"{name.replace('_', '-')}={getattr(t, name)} must be 0 (no pace) or more seconds")

