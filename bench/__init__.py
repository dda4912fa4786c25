"""Benchmarks (`make bench`): every figure is a ratio or a side-by-side pair measured in one run."""
