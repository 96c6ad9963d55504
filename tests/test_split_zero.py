"""onnxbuild.quant.split_zero: HQQ's float zero points split into uint8 ones plus block-sum offsets.

Graphs are quantized by ONNX Runtime's own HQQ quantizer (4-bit, block 32) and run in ONNX
Runtime before and after the rewrite: the outputs must agree to rounding (1e-5 of the output's
largest magnitude) at accuracy_level 0, and no float zero points may be left.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytest.importorskip("torch")  # ONNX Runtime's HQQ quantizer runs in torch
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnxbuild.quant.split_zero import split_float_zero_points  # noqa: E402

MS = "com.microsoft"


def hqq_model(k: int, ns: list[int], *, seed: int = 0) -> Any:
    """One MatMul of x [m, K] per entry of ``ns`` (outputs y0, y1, ...), HQQ-quantized."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    rng = np.random.default_rng(seed)
    nodes, outputs, weights = [], [], []
    for i, n in enumerate(ns):
        weights.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        outputs,
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    quantizer = MatMulNBitsQuantizer(model, algo_config=HQQWeightOnlyQuantConfig(block_size=32, bits=4))
    with warnings.catch_warnings():  # torch.from_numpy on the initializer's read-only array
        warnings.simplefilter("ignore", UserWarning)
        quantizer.process()
    out = quantizer.model.model
    assert [n.op_type for n in out.graph.node] == ["MatMulNBits"] * len(ns)
    assert all(float_zero_points(out, n) for n in out.graph.node)  # what this module is for
    return out


def float_zero_points(model: Any, node: Any) -> bool:
    inits = {t.name: t for t in model.graph.initializer}
    return len(node.input) > 3 and node.input[3] in inits and inits[node.input[3]].data_type == TensorProto.FLOAT


def with_level(model: Any, level: int) -> Any:
    out = onnx.ModelProto.FromString(model.SerializeToString())
    for node in out.graph.node:
        if node.op_type == "MatMulNBits":
            for a in [a for a in node.attribute if a.name == "accuracy_level"]:
                node.attribute.remove(a)
            if level:
                node.attribute.append(helper.make_attribute("accuracy_level", level))
    return out


def run(model: Any, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(y) for y in session.run(None, {"x": x})]


def split(model: Any) -> tuple[Any, int]:
    out = onnx.ModelProto.FromString(model.SerializeToString())
    count = split_float_zero_points(out)
    onnx.checker.check_model(out)
    return out, count


def relative_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got, want))


@pytest.mark.parametrize(("k", "n"), [(96, 40), (576, 64), (80, 24)])
def test_split_equals_float_zero_points(k: int, n: int) -> None:
    """K=80: the last block holds 16 of 32 rows (padding), its block sum only those."""
    model = with_level(hqq_model(k, [n]), 0)
    after, count = split(model)
    assert count == 1
    assert not any(float_zero_points(after, node) for node in after.graph.node)
    (node,) = [node for node in after.graph.node if node.op_type == "MatMulNBits"]
    assert node.name == "mm0_Q4"
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {
        "K": k,
        "N": n,
        "bits": 4,
        "block_size": 32,
    }
    assert "w0_zero_points" not in {t.name for t in after.graph.initializer}  # nothing reads it
    x = np.random.default_rng(1).standard_normal((7, k)).astype(np.float32)
    assert relative_error(run(after, x), run(model, x)) <= 1e-5


def test_activation_shared_block_sums() -> None:
    model = hqq_model(96, [40, 48])
    after, count = split(model)
    assert count == 2
    sums = [node for node in after.graph.node if node.name.endswith("_block_sums")]
    assert len(sums) == 1 and sums[0].input[0] == "x"
    assert len([t for t in after.graph.initializer if t.name.startswith("gguf.block_sums.")]) == 1
    x = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
    assert relative_error(run(after, x), run(model, x)) <= 1e-5


def test_bias_kept_and_g_idx_skipped() -> None:
    model = hqq_model(96, [40])
    node = model.graph.node[0]
    model.graph.initializer.append(numpy_helper.from_array(np.linspace(-1, 1, 40, dtype=np.float32), "bias"))
    node.input.extend(["", "bias"])  # g_idx left out, bias at index 5
    after, count = split(model)
    assert count == 1
    (new,) = [n for n in after.graph.node if n.op_type == "MatMulNBits"]
    assert list(new.input)[4:] == ["", "bias"]
    x = np.random.default_rng(3).standard_normal((4, 96)).astype(np.float32)
    assert relative_error(run(after, x), run(model, x)) <= 1e-5

    model.graph.initializer.append(numpy_helper.from_array(np.repeat(np.arange(3, dtype=np.int32), 32), "g_idx"))
    node.input[4] = "g_idx"
    skipped, count = split(model)
    assert count == 0
    assert skipped.graph.node[0] == node


def test_accuracy_level_4(capsys: pytest.CaptureFixture[str]) -> None:
    """At accuracy_level 4 the split node runs ONNX Runtime's int8 kernel (the float-zero-point
    node cannot: it dequantizes and computes in float), so the two differ by the activation's
    int8 rounding: reported, bounded only loosely."""
    model = with_level(hqq_model(576, [64]), 4)
    after, count = split(model)
    assert count == 1
    (node,) = [n for n in after.graph.node if n.op_type == "MatMulNBits"]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "accuracy_level")) == 4
    x = np.random.default_rng(4).standard_normal((7, 576)).astype(np.float32)
    error = relative_error(run(after, x), run(model, x))
    with capsys.disabled():
        print(f"\naccuracy_level 4: split vs float zero points, max |diff| / max |y| = {error:.2e}")
    assert error < 0.05


def test_block_sums_already_in_graph_reused() -> None:
    """A graph that already sums x's blocks (an earlier split, or gguf_exact's) after the node
    to rewrite: that sum is reused, moved up to stay before its first reader."""
    first, _ = split(hqq_model(96, [40]))
    other = hqq_model(96, [48], seed=1)
    renamed = {
        "w0_Q4": "w1_Q4",
        "w0_scales": "w1_scales",
        "w0_zero_points": "w1_zero_points",
        "y0": "y1",
    }
    node = other.graph.node[0]
    node.name = "mm1_Q4"
    node.input[:] = [renamed.get(i, i) for i in node.input]
    node.output[:] = ["y1"]
    for t in other.graph.initializer:
        t.name = renamed[t.name]
    first.graph.node.insert(0, node)
    first.graph.initializer.extend(other.graph.initializer)
    first.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["m", 48]))
    before = onnx.ModelProto.FromString(first.SerializeToString())

    after, count = split(first)  # check_model: still topologically sorted
    assert count == 1
    sums = [n for n in after.graph.node if n.name.endswith("_block_sums")]
    assert len(sums) == 1 and after.graph.node[0] == sums[0]
    x = np.random.default_rng(5).standard_normal((2, 96)).astype(np.float32)
    assert relative_error(run(after, x), run(before, x)) <= 1e-5
