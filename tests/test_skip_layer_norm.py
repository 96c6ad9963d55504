"""fusion/layernorm.py: SkipLayerNormalization written as Sum + LayerNormalization, checked
against ONNX Runtime's own kernel on real sessions."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxbuild.fusion.layernorm import split_skip_layer_norm
from onnxbuild.steps.optimize import skip_layer_norm

H = 16


def model(opset: int = 18, bias: bool = True, sum_output: bool = True) -> onnx.ModelProto:
    """x -> SkipLayerNormalization(x, skip, gamma, beta[, bias]) twice, the second on the first's sum."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), n) for n in ("gamma", "beta", "bias")]
    ins = ["x", "skip", "gamma", "beta"] + (["bias"] if bias else [])
    first = helper.make_node(
        "SkipLayerNormalization",
        ins,
        ["y1", "", "", "s1"] if sum_output else ["y1"],
        "sln1",
        domain="com.microsoft",
        epsilon=1e-5,
    )
    second = helper.make_node(
        "SkipLayerNormalization",
        ["y1", "s1" if sum_output else "skip", "gamma", "beta"],
        ["y2"],
        "sln2",
        domain="com.microsoft",
        epsilon=1e-5,
    )
    graph = helper.make_graph(
        [first, second],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", H]) for n in ("x", "skip")],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["b", "s", H])],
        inits,
    )
    return helper.make_model(
        graph, ir_version=9, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )


def run(m: onnx.ModelProto, level: Any = ort.GraphOptimizationLevel.ORT_ENABLE_ALL, save: str = "") -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    if save:
        options.optimized_model_filepath = save
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal((2, 5, H)).astype(np.float32) for n in ("x", "skip")}
    return np.asarray(session.run(None, feed)[0])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sum_output", [True, False])
def test_the_split_graph_computes_what_the_fused_kernel_does(bias: bool, sum_output: bool) -> None:
    fused = model(bias=bias, sum_output=sum_output)
    expected = run(fused)
    split = model(bias=bias, sum_output=sum_output)
    assert split_skip_layer_norm(split) == 2
    onnx.checker.check_model(split, full_check=True)
    ops = [n.op_type for n in split.graph.node]
    assert "SkipLayerNormalization" not in ops
    assert ops.count("LayerNormalization") == 2 and ops.count("Sum") == 2
    assert ops.count("Add") == (1 if bias else 0)  # the bias on its own Add, where a MatMul can take it
    np.testing.assert_allclose(run(split), expected, atol=1e-5, rtol=1e-5)


def test_onnxruntime_does_not_fuse_the_pair_back(tmp_path: Any) -> None:
    """The reason for Sum: an Add + LayerNormalization would be SkipLayerNormalization again
    once a session optimizes at its default level."""
    split = model()
    split_skip_layer_norm(split)
    saved = tmp_path / "session.onnx"
    run(split, save=str(saved))
    ops = {n.op_type for n in onnx.load(str(saved)).graph.node}
    assert "SkipLayerNormalization" not in ops and {"Sum", "LayerNormalization"} <= ops


def test_below_opset_17_the_model_is_left_fused() -> None:
    old = model(opset=16)
    assert split_skip_layer_norm(old) == 0
    assert [n.op_type for n in old.graph.node] == ["SkipLayerNormalization"] * 2


@pytest.mark.parametrize(
    ("asked", "providers", "resolved"),
    [
        ("auto", [{"name": "CPUExecutionProvider"}], "sum"),
        ("auto", [{"name": "CPUExecutionProvider"}, {"name": "web"}, {"name": "openvino"}], "sum"),
        ("auto", [{"name": "CUDAExecutionProvider"}, {"name": "CPUExecutionProvider"}], "fused"),
        ("fused", [{"name": "CPUExecutionProvider"}], "fused"),
        ("sum", [{"name": "CUDAExecutionProvider"}], "sum"),
    ],
)
def test_auto_splits_only_where_every_provider_runs_on_the_cpu(
    asked: str, providers: list[dict[str, str]], resolved: str
) -> None:
    assert skip_layer_norm(asked, providers) == resolved
