"""A weight read through an Identity (the TorchScript exporter's form of a module called twice,
ALBERT's shared layer) is quantized at every call, by the 4-bit and the dynamic int8 methods:
onnxruntime's quantizers take only an initializer as a weight, and left the later calls float.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxbuild  # noqa: E402
from onnxbuild.quant.aliases import fold_weight_aliases  # noqa: E402


def shared_layer(path: Path) -> None:
    """x -> MatMul(w) -> Relu -> MatMul(Identity(w)): one [64, 64] weight, called twice."""
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((64, 64)) * 0.1).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/layer/dense/MatMul"),
        helper.make_node("Relu", ["h"], ["r"], name="/layer/Relu"),
        helper.make_node("Identity", ["w"], ["w_again"], name="/layer/Identity"),
        helper.make_node("MatMul", ["r", "w_again"], ["y"], name="/layer/dense_1/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def test_fold_reads_the_initializer_and_keeps_an_identity_that_is_a_graph_output(tmp_path: Path) -> None:
    shared_layer(tmp_path / "m.onnx")
    model = onnx.load(str(tmp_path / "m.onnx"))
    model.graph.output.append(helper.make_tensor_value_info("w_again", TensorProto.FLOAT, [64, 64]))
    assert fold_weight_aliases(model) == 0  # a name the caller reads stays
    del model.graph.output[1]
    assert fold_weight_aliases(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Relu", "MatMul"]
    assert model.graph.node[2].input[1] == "w"


def test_both_calls_of_a_shared_weight_are_quantized_and_validate(tmp_path: Path) -> None:
    shared_layer(tmp_path / "model.onnx")
    (tmp_path / "shared.yaml").write_text(
        "name: shared\nsource:\n  onnx: {path: model.onnx}\n"
        "quantize:\n- {name: int8, method: dynamic}\n- {name: int4, method: int4, block_size: 32}\n",
        encoding="utf-8",
    )
    report = onnxbuild.build(
        [tmp_path / "shared.yaml"],
        onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts"),
    )
    assert report.ok, report.failures()
    for variant, op in (("int4", "MatMulNBits"), ("int8", "MatMulInteger")):
        model = onnx.load(str(tmp_path / "artifacts" / "shared" / variant / "model.onnx"))
        ops = [n.op_type for n in model.graph.node]
        assert ops.count(op) == 2, (variant, ops)
        assert "MatMul" not in ops and "Identity" not in ops
        assert "w" not in {t.name for t in model.graph.initializer}  # the float weight is gone, not kept twice
