"""A mixture of experts' tables in 4 and 8 bits (onnxbuild/quant/experts.py): the rewritten
Gather, run by ONNX Runtime, returns the blocks' dequantized rows, within half a step of the
float table; a tiny Mixtral's int4 file holds no float expert table and passes validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxbuild.quant.experts import experts_into_blocks
from tests.helpers_cli import run


def _gather_model(table: np.ndarray) -> onnx.ModelProto:
    """idx -> Gather(table, idx) -> MatMul by a float [in, 3] weight (which stays float here)."""
    nodes = [
        helper.make_node("Gather", ["experts", "idx"], ["chosen"], name="/mlp/experts/Gather", axis=0),
        helper.make_node("MatMul", ["chosen", "w"], ["y"], name="/mlp/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(table, "experts"),
            numpy_helper.from_array(np.ones((table.shape[2], 3), np.float32), "w"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, True), (8, False)])
def test_expert_tables_dequantize_within_half_a_step(bits: int, symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    width = 64 if symmetric else 96  # 3 blocks: the zero points' last byte half empty at 4 bits
    table = (rng.standard_normal((4, 6, width)) + (0 if symmetric else 0.7)).astype(np.float32)
    model = _gather_model(table)
    assert experts_into_blocks(model, bits, 32, symmetric, exclude=[]) == 1
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized", "MatMul"]
    # the float table is gone; the MatMul's weight (not a Gather's table) is untouched
    assert {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT} == {
        "w",
        f"experts_Q{bits}G32_scales",
    }
    data = next(t for t in model.graph.initializer if t.name == f"experts_Q{bits}G32")
    assert list(data.dims) == [4, 6, width * bits // 8]  # two values per byte at 4 bits
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    idx = np.array([3, 0, 3, 1])
    got = session.run(None, {"idx": idx})[0]
    want = table[idx].sum(axis=-1, keepdims=True).repeat(3, axis=-1)
    # each weight within half its block's step; a row sums width of them
    steps = np.abs(table).max() / ((1 << (bits - 1)) - 1) if symmetric else np.ptp(table) / ((1 << bits) - 1)
    assert np.abs(got - want).max() <= width * steps / 2
    assert np.abs(got - want).max() > 0  # it is quantized: not the float table


def test_a_gather_that_is_no_expert_table_is_left_alone() -> None:
    rng = np.random.default_rng(0)
    model = _gather_model(rng.standard_normal((4, 6, 48)).astype(np.float32))  # 48: not whole blocks of 32
    assert experts_into_blocks(model, 4, 32, True, exclude=[]) == 0
    model = _gather_model(rng.standard_normal((4, 6, 64)).astype(np.float32))
    assert experts_into_blocks(model, 4, 32, True, exclude=["/mlp/experts/Gather"]) == 0
    assert [n.op_type for n in model.graph.node] == ["Gather", "MatMul"]


MIXTRAL = """
name: mixtral-tiny
source:
  huggingface:
    model: mistralai/Mixtral-8x7B-v0.1
    task: text-generation
    offline: random-init
    seed: 0
    config:
      model_type: mixtral
      vocab_size: 1000
      hidden_size: 64
      intermediate_size: 128
      num_hidden_layers: 2
      num_attention_heads: 4
      num_key_value_heads: 2
      num_local_experts: 4
      num_experts_per_tok: 2
      max_position_embeddings: 256
export:
  with_past: true
quantize:
  - name: int4
    method: int4
    block_size: 32
    embedding: {embedding}
    validate:
      # random weights give near-flat logits, where 4-bit noise flips argmaxes (0.78 with the
      # embedding in 4 bits too)
      top1_min: 0.5
expect:
  int4:
    # gate_up and down tables of 2 layers (and the embedding, when it is quantized): onnxruntime's
    # quantizer takes the expert tables too when it is given Gathers (embedding: true), and
    # onnxbuild/quant/experts.py when not
    ops: {{GatherBlockQuantized: {gathers}}}
    # the float embedding is most of a tiny model's bytes
    weights: {{int4: {share}}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("embedding", [False, True])
def test_a_mixtral_int4_file_holds_its_experts_in_4_bits(
    embedding: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "recipes").mkdir()
    recipe = MIXTRAL.format(
        embedding=str(embedding).lower(), gathers=5 if embedding else 4, share=0.75 if embedding else 0.25
    )
    (tmp_path / "recipes" / "mixtral.yaml").write_text(recipe, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = run("make", "recipes/mixtral.yaml")
    assert result.exit_code == 0, result.output  # validate.int4 passed, the expect block held
    art = tmp_path / "artifacts" / "mixtral-tiny"
    int4 = onnx.load_model(str(art / "int4" / "model.onnx"))
    floats = {t.name for t in int4.graph.initializer if t.data_type == TensorProto.FLOAT}
    tables = {t.name for t in int4.graph.initializer if len(t.dims) == 3}
    assert not [n.name for n in int4.graph.node if n.op_type == "Gather" and n.input[0] in floats & tables]
    assert (art / "int4" / "model.onnx").stat().st_size < (0.25 if embedding else 0.45) * (
        art / "model.onnx"
    ).stat().st_size
