"""The digits workload reads scikit-learn's bundled file without importing scikit-learn: the same arrays."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

from training.workloads import digits_arrays

TRAINING = Path(__file__).resolve().parents[2] / "training"


def test_digits_arrays_equal_load_digits():
    images, target = digits_arrays()
    data = load_digits()
    assert images.shape == (1797, 8, 8) and np.array_equal(images, data.images)
    assert np.array_equal(target, data.target) and target.dtype == data.target.dtype


def test_no_trainer_module_imports_scikit_learn():
    """Every rank would pay scikit-learn's import (about a second of CPU) for a file it can read itself."""
    found = []
    for path in TRAINING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "sklearn"]
    assert not found, found
