"""The digits MLP of digits_mlp.py, in Keras: the seeds' PyTorch-vs-TensorFlow comparison.

The same data (scikit-learn's bundled 8x8 digits, the same fixed 80/20 split, so
``digits_mlp.test_set`` scores both), the same 64 -> 64 -> 10 shape, trained briefly at
build time. TensorFlow is seeded and its ops made deterministic (onnxbuild does both
before calling the factory), so every step's process builds the same weights.
"""

from __future__ import annotations

from typing import Any

from digits_mlp import _split


def build(hidden: int = 64, epochs: int = 20, batch_size: int = 64) -> Any:
    """A Keras model taking ``pixels`` [batch, 64] to ``logits`` [batch, 10], trained on the train split."""
    import tensorflow as tf

    x_train, _, y_train, _ = _split()
    inputs = tf.keras.Input(shape=(64,), name="pixels")
    hidden_layer = tf.keras.layers.Dense(hidden, activation="relu")(inputs)
    logits = tf.keras.layers.Dense(10, name="logits")(hidden_layer)
    model = tf.keras.Model(inputs, logits)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size, shuffle=True, verbose=0)
    return model
