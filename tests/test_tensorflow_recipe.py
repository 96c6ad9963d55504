"""Recipe mistakes of a tensorflow source, named with the fix (no TensorFlow needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxbuild.api import load_recipe
from onnxbuild.errors import RecipeError

INPUTS = "export:\n  inputs: [{name: pixels, dtype: float32, shape: [batch, 64]}]\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "source:\n  tensorflow: {factory: 'm.py:build', keras: m.keras}\n" + INPUTS,
            "source.tensorflow: give exactly one of `factory` (file.py:function) and `keras` (a .keras file); it "
            "has both",
        ),
        (
            "source:\n  tensorflow: {kwargs: {}}\n" + INPUTS,
            "source.tensorflow: give exactly one of `factory` (file.py:function) and `keras` (a .keras file); it "
            "has neither",
        ),
        (
            "source:\n  tensorflow: {factory: 'm.py:build'}\n",
            "a tensorflow source needs export.inputs (its input signature: name, dtype and shape of each model input)",
        ),
        (
            "source:\n  tensorflow: {keras: model.h5}\n" + INPUTS,
            "source.tensorflow.keras: must be a .keras file saved with model.save(), relative to the recipe's folder",
        ),
        (
            "source:\n  tensorflow: {factory: 'm.py:build'}\n" + INPUTS + "  exporter: dynamo\n",
            "export.exporter: a tensorflow source is converted with tf2onnx; remove export.exporter",
        ),
    ],
)
def test_tensorflow_source_mistakes(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tf.yaml"
    path.write_text("name: tf\n" + text, encoding="utf-8")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert message in str(err.value)
