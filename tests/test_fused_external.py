"""Issue 51: the fused decoder writes its weights straight into external data (never all held
as TensorProtos or serialized at once, what a 1B model needs), and that path writes the same
graph and the same weights as the in-memory one."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import transformers
import yaml
from onnx import external_data_helper, numpy_helper

import onnxbuild
from onnxbuild.fusion import decoder
from tests.helpers_tiny import TINY_DECODER_SIZES

DATA = Path(__file__).resolve().parent / "data"


def test_the_streamed_weights_are_the_in_memory_ones_and_the_graph_is_the_same(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_DECODER_SIZES)).eval()
    exported = onnx.helper.make_model(
        onnx.helper.make_graph(
            [],
            "export",
            [
                onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT64, ["batch", "sequence"])
                for n in ("input_ids", "attention_mask")
            ]
            + [
                onnx.helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kv}", onnx.TensorProto.FLOAT, ["batch", 2, "past", 16]
                )
                for i in range(2)
                for kv in ("key", "value")
            ],
            [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", "sequence", 1000])],
        )
    )
    held = decoder.build(model, exported).model
    with open(tmp_path / "model.onnx.data", "wb") as data:
        streamed = decoder.build(model, exported, data, "model.onnx.data").model
    outside = [t for t in streamed.graph.initializer if external_data_helper.uses_external_data(t)]
    assert len(outside) >= 2 * 4 + 1  # every layer's matrices and the embedding, not the small constants
    assert all(
        int(e.value) % decoder.EXTERNAL_ALIGN == 0 for t in outside for e in t.external_data if e.key == "offset"
    )
    external_data_helper.load_external_data_for_model(streamed, str(tmp_path))
    assert [(t.name, numpy_helper.to_array(t).tobytes()) for t in streamed.graph.initializer] == [
        (t.name, numpy_helper.to_array(t).tobytes()) for t in held.graph.initializer
    ]
    assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in held.graph.node]
    del streamed.graph.initializer[:], held.graph.initializer[:]
    assert streamed.SerializeToString() == held.SerializeToString()


def test_a_fused_decoder_written_as_external_data_validates_and_quantizes(tmp_path: Path) -> None:
    doc = yaml.safe_load((DATA / "tiny-llama.yaml").read_text(encoding="utf-8"))
    doc["export"]["external_data"] = "always"  # as a model over 2 GB writes it
    doc["quantize"] = [{"name": "int4", "method": "int4", "from": "optimized", "block_size": 32}]
    for key in ("generate", "benchmark"):
        doc.pop(key, None)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([tmp_path / "tiny.yaml"], settings)
    assert report.ok, report.failures()
    folder = tmp_path / "artifacts" / "tiny-llama"
    optimized = onnx.load_model(str(folder / "optimized" / "model.onnx"), load_external_data=False)
    assert any(external_data_helper.uses_external_data(t) for t in optimized.graph.initializer)
    assert (folder / "optimized" / "model.onnx.data").stat().st_size > 700_000  # the 0.2M weights in fp32
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["variants"]["optimized"]["passed"] and validation["variants"]["int4"]["passed"]
    worst = max(c["max_abs_diff"] for s in validation["variants"]["optimized"]["shapes"] for c in s["outputs"].values())
    assert worst < 1e-4
    assert validation["variants"]["int4"]["weights"]["checked"] == 11  # each MatMul against the external weights
    assert not list(folder.rglob("stage-*"))
