"""A small MLP for handwritten digits, trained at build time on data shipped with scikit-learn.

The seeds' MNIST walk-through, without a download: scikit-learn bundles 1,797 8x8
digit images (``sklearn.datasets.load_digits``). ``build`` trains a 64 -> 64 -> 10 MLP
on a fixed 80% of them in about a second; ``test_set`` returns the other 20%, which
training never sees, for ``validate.accuracy`` to score PyTorch and ONNX Runtime on.

Training is deterministic (fixed seed, fixed split, one thread), so the export and
validate steps, each in its own process, build the same weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SPLIT_SEED = 0
TEST_FRACTION = 0.2


def _split() -> tuple[Any, Any, Any, Any]:
    """(train pixels, test pixels, train labels, test labels): a fixed, stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)  # intensities 0..16 -> 0..1
    labels = digits.target.astype(np.int64)
    split: tuple[Any, Any, Any, Any] = tuple(  # type: ignore[assignment]
        train_test_split(pixels, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels)
    )
    return split


def build(hidden: int = 64, epochs: int = 20, lr: float = 0.01, batch_size: int = 64, seed: int = 0) -> Any:
    """An MLP taking ``pixels`` [batch, 64] to ``logits`` [batch, 10], trained on the train split."""
    import torch

    x_train, _, y_train, _ = _split()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return train(model, x_train, y_train, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def train(model: Any, x_train: Any, y_train: Any, *, epochs: int, lr: float, batch_size: int, seed: int) -> Any:
    """Adam on cross-entropy in seeded mini-batches; the model in eval mode."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float sums, so the same weights, in every process
    try:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
        order = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(epochs):
            for idx in torch.randperm(len(x), generator=order).split(batch_size):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def test_set() -> tuple[dict[str, Any], Any]:
    """The held-out split: ({"pixels": float32 [N, 64]}, int64 labels [N])."""
    _, x_test, _, y_test = _split()
    return {"pixels": x_test}, y_test
