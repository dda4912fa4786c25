"""Workloads: a dataset split (train/val/test) and a model that learns it, chosen by name.

* ``digits``: scikit-learn's bundled 8x8 digits (real data, offline), a small CNN (>= 95% test accuracy).
* ``mnist``: torchvision MNIST, only when torchvision imports and the files are already on disk.
* ``regression``: a synthetic linear regression that really learns (loss falls by orders of magnitude).
* ``mlp``: a 5,267,466-parameter MLP on random data, for step-time benchmarks (accuracy is meaningless).

Splits are fixed by a constant seed, independent of the training seed and of the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from .config import ConfigError, TrainConfig

SPLIT_SEED = 1234


@dataclass
class Workload:
    name: str
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    model: nn.Module
    loss: nn.Module
    classification: bool
    lr: float = 3e-3  # learning rate unless the config sets one
    optimizer: str = "adam"  # adam | sgd (momentum 0.9)


def _split(x: torch.Tensor, y: torch.Tensor, val: float = 0.15, test: float = 0.15):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test, n_val = int(len(x) * test), int(len(x) * val)
    parts = order[n_test + n_val:], order[n_test:n_test + n_val], order[:n_test]
    return [TensorDataset(x[idx], y[idx]) for idx in parts]


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 1, side: int = 8, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * (side // 2) ** 2, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits_arrays():
    """scikit-learn's bundled digits, (images of shape (1797, 8, 8), targets), read as ``load_digits`` reads them
    (``np.loadtxt`` of its ``datasets/data/digits.csv.gz``, sklearn/datasets/_base.py) but found without importing
    scikit-learn: that import (scipy with it) costs every rank about a second of CPU, more than its first epochs.
    tests/unit/test_workloads.py checks the arrays equal ``load_digits()``'s."""
    import gzip
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # a top-level package is found, not imported
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.is_file():
        raise ConfigError("workload digits reads scikit-learn's bundled digits.csv.gz: pip install scikit-learn==1.9.1")
    with gzip.open(path, mode="rt", encoding="utf-8") as fh:
        data = np.loadtxt(fh, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def digits(cfg: TrainConfig) -> Workload:
    images, target = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    train, val, test = _split(x, y)
    return Workload("digits", train, val, test, DigitsCNN(), nn.CrossEntropyLoss(), True)


def mnist(cfg: TrainConfig) -> Workload:
    try:
        from torchvision import datasets
    except Exception as err:  # ImportError, or torchvision's operator mismatch with this torch
        raise ConfigError(
            f"workload mnist needs torchvision, which does not import here ({type(err).__name__}); "
            "PyPI's torchvision does not load beside torch 2.13 CPU: use --workload digits, or install a matching torchvision"
        ) from None
    root = Path(cfg.data_dir)
    if not (root / "MNIST" / "raw").is_dir():
        raise ConfigError(f"MNIST is not in {root}/MNIST/raw and nodes are offline; download it there first or use --workload digits")
    train_full = datasets.MNIST(str(root), train=True, download=False)
    test_set = datasets.MNIST(str(root), train=False, download=False)
    x = train_full.data.unsqueeze(1).float() / 255.0
    xt = test_set.data.unsqueeze(1).float() / 255.0
    train, val, _ = _split(x, train_full.targets, val=0.1, test=0.0)
    return Workload("mnist", train, val, TensorDataset(xt, test_set.targets), DigitsCNN(side=28),
                    nn.CrossEntropyLoss(), True)


def regression(cfg: TrainConfig) -> Workload:
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    x = torch.randn(4096, 16, generator=gen)
    w = torch.randn(16, 1, generator=gen)
    y = x @ w + 0.01 * torch.randn(4096, 1, generator=gen)
    train, val, test = _split(x, y)
    return Workload("regression", train, val, test, nn.Linear(16, 1), nn.MSELoss(), False, lr=0.05)


def mlp(cfg: TrainConfig) -> Workload:
    """512 -> 2048 -> 2048 -> 10 (5,267,466 parameters, checked by tests/unit/test_bench.py), the benchmark model of the field notes.

    SGD: Adam's update of 5 M parameters on one core costs as much as the forward and backward
    passes together, which would hide the difference between data planes this model measures."""
    steps = cfg.steps_per_epoch or 30  # per rank, with 2 ranks
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    n = steps * cfg.batch_size * 2
    x = torch.randn(n, 512, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    small = TensorDataset(x[:256], y[:256])
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    return Workload("mlp", TensorDataset(x, y), small, small, model, nn.CrossEntropyLoss(), True, lr=0.01, optimizer="sgd")


WORKLOADS = {"digits": digits, "mnist": mnist, "regression": regression, "mlp": mlp}


def build(cfg: TrainConfig) -> Workload:
    """The workload's data and a freshly initialised model (seeded by the caller)."""
    return WORKLOADS[cfg.workload](cfg)
