"""A small convolutional network for scikit-learn's 8x8 digits, as images: the real-weights
check of the image path (pixel_values [batch, 1, 8, 8]), trained at build time.

Same data and split as digits_mlp.py (imported: the recipe's folder is on the path while
a factory loads), so the two recipes score the same held-out 20%.
"""

from __future__ import annotations

from typing import Any

from digits_mlp import _split, train


def build(channels: int = 16, epochs: int = 15, lr: float = 0.01, batch_size: int = 64, seed: int = 0) -> Any:
    """conv 3x3 -> ReLU -> conv 3x3 (stride 2) -> ReLU -> global average -> linear: logits [batch, 10]."""
    import torch

    x_train, _, y_train, _ = _split()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, channels, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * channels, 10),
    )
    return train(model, x_train.reshape(-1, 1, 8, 8), y_train, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def test_set() -> tuple[dict[str, Any], Any]:
    """The held-out split as images: ({"pixel_values": float32 [N, 1, 8, 8]}, int64 labels [N])."""
    _, x_test, _, y_test = _split()
    return {"pixel_values": x_test.reshape(-1, 1, 8, 8)}, y_test
