"""A two-layer MLP factory for pytorch-source tests."""

import torch


def build(hidden: int = 8) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))


def not_a_module() -> int:
    return 3


def broken() -> torch.nn.Module:
    raise RuntimeError("factory exploded")
