"""The model and each rank's data: a linear layer fitted to a constant target."""

import torch


def make_model() -> torch.nn.Module:
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    return model


def batch(rank: int, size: int, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank sees different inputs, so only averaged gradients keep the replicas identical."""
    return torch.full((size, 4), float(rank + 1)), torch.full((size, 1), target)
