"""A module whose export OpenVINO refuses and ONNX Runtime runs: ``torch.linalg.det`` is
ONNX's ``Det``, which OpenVINO's ONNX frontend has no conversion for (2026.4)."""

import torch


class Determinant(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(x.reshape(-1, 3, 3)).unsqueeze(-1)


def build() -> torch.nn.Module:
    return Determinant()
