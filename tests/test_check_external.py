"""The check step on a model whose weights are in a .data file (every model over 2 GB): the
engine hard-links that file into the step's folder, which onnx's checker refuses as "a potential
hardlink attack"; the step checks the graph with those weights as inputs and the data file's
extents itself, so a 2.4 GB FlauBERT passes (measured) and a truncated or missing file does not."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxbuild.errors import StepError
from onnxbuild.steps.check import _check


def _saved(folder: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(np.ones((16, 8), np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def test_a_hard_linked_data_file_is_checked(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "step").mkdir()
    stored = _saved(tmp_path / "store")
    os.link(stored, tmp_path / "step" / "model.onnx")
    os.link(stored.with_suffix(".onnx.data"), tmp_path / "step" / "model.onnx.data")
    with pytest.raises(onnx.checker.ValidationError, match="hard link"):
        onnx.checker.check_model(str(tmp_path / "step" / "model.onnx"), full_check=True)  # why the step works around it
    report = _check(tmp_path / "step" / "model.onnx", "model.onnx", tmp_path)
    assert report["parameters"] == 16 * 8


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda data: data.write_bytes(data.read_bytes()[:100]),
            "model.onnx: weight 'w' reads bytes 0..512 of model.onnx.data, which holds 100: "
            "the data file is truncated or not this model's",
        ),
        (
            lambda data: data.unlink(),
            "model.onnx: weight 'w' is stored in 'model.onnx.data', which is not a file beside the model; "
            "keep the .onnx and its .data files together",
        ),
    ],
)
def test_a_truncated_or_missing_data_file_fails_the_step(
    tmp_path: Path, damage: Callable[[Path], object], message: str
) -> None:
    path = _saved(tmp_path)
    damage(path.with_suffix(".onnx.data"))
    with pytest.raises(StepError) as exc:
        _check(path, "model.onnx", tmp_path)
    assert str(exc.value) == message
