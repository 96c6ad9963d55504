"""Issue 51: the fused decoder writes its weights straight into external data (never all held
as TensorProtos or serialized at once, what a 1B model needs), and that path writes the same
graph and the same weights as the in-memory one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
import transformers
import yaml
from onnx import external_data_helper, numpy_helper

import onnxbuild
from onnxbuild.fusion import decoder
from tests.helpers_tiny import TINY_DECODER_SIZES

DATA = Path(__file__).resolve().parent / "data"


def _signature() -> onnx.ModelProto:
    return onnx.helper.make_model(
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


def test_the_streamed_weights_are_the_in_memory_ones_and_the_graph_is_the_same(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_DECODER_SIZES)).eval()
    exported = _signature()
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


def _built(tmp_path: Path, doc: dict[str, Any], without: tuple[str, ...]) -> Path:
    """tests/data/tiny-llama.yaml as ``doc`` changed it, less the sections ``without``, built: its artifacts."""
    for key in without:
        doc.pop(key, None)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([tmp_path / "tiny.yaml"], settings)
    assert report.ok, report.failures()
    return tmp_path / "artifacts" / "tiny-llama"


def test_a_fused_decoder_written_as_external_data_validates_and_quantizes(tmp_path: Path) -> None:
    doc = yaml.safe_load((DATA / "tiny-llama.yaml").read_text(encoding="utf-8"))
    doc["export"]["external_data"] = "always"  # as a model over 2 GB writes it
    doc["quantize"] = [{"name": "int4", "method": "int4", "from": "optimized", "block_size": 32}]
    folder = _built(tmp_path, doc, ("generate", "benchmark"))
    optimized = onnx.load_model(str(folder / "optimized" / "model.onnx"), load_external_data=False)
    assert any(external_data_helper.uses_external_data(t) for t in optimized.graph.initializer)
    assert (folder / "optimized" / "model.onnx.data").stat().st_size > 700_000  # the 0.2M weights in fp32
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["variants"]["optimized"]["passed"] and validation["variants"]["int4"]["passed"]
    worst = max(c["max_abs_diff"] for s in validation["variants"]["optimized"]["shapes"] for c in s["outputs"].values())
    assert worst < 1e-4
    assert validation["variants"]["int4"]["weights"]["checked"] == 11  # each MatMul against the external weights
    assert not list(folder.rglob("stage-*"))


def test_the_graph_written_from_the_checkpoint_files_is_the_one_written_from_the_model(tmp_path: Path) -> None:
    """The fused graph read tensor by tensor from a bf16 safetensors folder (sources/checkpoint.Lazy),
    with a tied embedding, is byte for byte the one written from transformers' fp32 model of it."""
    import torch

    from onnxbuild.sources import checkpoint

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY_DECODER_SIZES, "tie_word_embeddings": True})
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "folder")
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "folder", dtype=torch.float32).eval()
    found = checkpoint.Checkpoint.of_folder(tmp_path / "folder")
    assert found is not None and "lm_head.weight" not in found  # tied: stored once
    lazy = checkpoint.lazy_model(transformers.LlamaForCausalLM, model.config, found)
    held = decoder.build(model, _signature()).model
    read = decoder.build(lazy, _signature()).model
    assert read.SerializeToString() == held.SerializeToString()


def test_streamed_random_init_is_seeded_and_loads_in_transformers(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from onnxbuild.sources import checkpoint

    config = transformers.LlamaConfig(**{**TINY_DECODER_SIZES, "tie_word_embeddings": True})
    for name, dtype in (("a", "float32"), ("b", "float32"), ("c", "bfloat16")):
        count = checkpoint.write_random_init(
            transformers.LlamaForCausalLM, config, 7, tmp_path / name / "model.safetensors", dtype
        )
        config.to_json_file(str(tmp_path / name / "config.json"))
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    assert count == sum(p.numel() for p in model.parameters())
    table = model.model.embed_tokens.weight.detach().numpy()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert abs(float(table.std()) - config.initializer_range) < 0.002
    assert np.all(model.model.norm.weight.detach().numpy() == 1.0)
    half = checkpoint.Checkpoint.of_folder(tmp_path / "c")
    assert half is not None
    wide = half.array("model.embed_tokens.weight")
    assert wide.dtype == np.float32 and np.abs(wide - table).max() <= np.abs(table).max() / 128


# onnxruntime's HQQ writer hands torch a read-only view of the weight, which it only reads
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_weight_only_quantization_streamed_one_matmul_at_a_time_writes_the_in_memory_result(tmp_path: Path) -> None:
    """quant/streamed.py: each MatMul cut out with its weight alone and quantized by the same
    function as the whole graph in memory gives the same nodes and the same tensors (HQQ 4-bit
    with its split zero points; round-to-nearest 8- and 4-bit, which streamed come straight from
    onnxruntime's kernel, quant/streamed.rounded), the tied table left float once."""
    import torch
    from onnx import numpy_helper

    from onnxbuild.steps.quantizing.nbits import bias_into_nbits, weight_only, weight_only_proto

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY_DECODER_SIZES, "tie_word_embeddings": True})
    model = transformers.LlamaForCausalLM(config).eval()
    with open(tmp_path / "model.onnx.data", "wb") as data:
        fused = decoder.build(model, _signature(), data, "model.onnx.data").model
    onnx.save_model(fused, str(tmp_path / "model.onnx"))
    base = {"name": "q", "block_size": 32, "symmetric": False, "accuracy_level": 4, "embedding": False}
    for q in (
        {**base, "method": "int4", "bits": 4, "algorithm": "hqq", "keep": [], "exclude_nodes": []},
        {**base, "method": "weight_only", "bits": 8, "algorithm": "rtn", "keep": [], "exclude_nodes": []},
        {**base, "symmetric": True, "method": "int4", "bits": 4, "algorithm": "rtn", "keep": [], "exclude_nodes": []},
    ):
        out = tmp_path / f"{q['method']}-{q['algorithm']}" / "model.onnx"
        out.parent.mkdir()
        weight_only(tmp_path / "model.onnx", out, q)  # type: ignore[arg-type]
        held = weight_only_proto(onnx.load_model(str(tmp_path / "model.onnx")), q)  # type: ignore[arg-type]
        bias_into_nbits(held)
        streamed = onnx.load_model(str(out))
        assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in held.graph.node]
        tensors = {t.name: numpy_helper.to_array(t).tobytes() for t in streamed.graph.initializer}
        assert tensors == {t.name: numpy_helper.to_array(t).tobytes() for t in held.graph.initializer}
        assert (
            sum(n.op_type == "MatMulNBits" for n in streamed.graph.node) == 2 * 5 + 1
        )  # qkv, o, gate, up, down per layer, and lm_head
        assert "lm_head.weight" in tensors  # the tied table, for the lookup


@pytest.mark.parametrize(("bits", "symmetric"), [(4, True), (4, False), (8, True), (8, False)])
def test_round_to_nearest_from_the_kernel_is_what_the_quantizer_writes(bits: int, symmetric: bool) -> None:
    """quant/streamed.rounded: the nodes and tensors onnxruntime's MatMulNBitsQuantizer writes,
    byte for byte, for a weight whose rows are no whole number of blocks (48 of block 32)."""
    import numpy as np

    from onnxbuild.quant.streamed import alone, rounded
    from onnxbuild.steps.quantizing.nbits import weight_only_proto

    w = np.random.default_rng(bits).standard_normal((48, 24)).astype(np.float32)
    node = onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="/m/MatMul")
    q = {"method": "int4" if bits == 4 else "weight_only", "bits": bits, "block_size": 32, "symmetric": symmetric}
    q |= {"accuracy_level": 4, "algorithm": "rtn", "embedding": False, "keep": [], "exclude_nodes": []}
    held = weight_only_proto(alone(node, w), q)  # type: ignore[arg-type]
    direct = rounded(node, w, bits, 32, symmetric, 4)
    assert direct is not None
    assert [n.SerializeToString() for n in direct.graph.node] == [n.SerializeToString() for n in held.graph.node]
    made = sorted(t.SerializeToString() for t in direct.graph.initializer)
    assert made == sorted(t.SerializeToString() for t in held.graph.initializer if t.name != "w")


def test_a_model_streamed_layer_by_layer_computes_what_the_loaded_one_does(tmp_path: Path) -> None:
    """sources/checkpoint.streamed_model: transformers' own forward and generate, each layer read
    from the checkpoint just before it runs and dropped after, give the loaded model's logits,
    cache and greedy tokens exactly."""
    import torch

    from onnxbuild.sources import checkpoint

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**TINY_DECODER_SIZES, "tie_word_embeddings": True})
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    found = checkpoint.Checkpoint.of_folder(tmp_path)
    assert found is not None
    streamed = checkpoint.streamed_model(transformers.AutoModelForCausalLM, loaded.config, found, torch.float32)
    streamed.eval()
    assert all(p.device.type == "meta" for p in streamed.model.layers.parameters())
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        a, b = loaded(input_ids=ids, use_cache=True), streamed(input_ids=ids, use_cache=True)
        assert torch.equal(a.logits, b.logits)
        assert torch.equal(a.past_key_values.layers[1].keys, b.past_key_values.layers[1].keys)
        assert torch.equal(
            loaded.generate(ids, max_new_tokens=6, do_sample=False),
            streamed.generate(ids, max_new_tokens=6, do_sample=False),
        )
    assert all(p.device.type == "meta" for p in streamed.model.layers.parameters())  # dropped again


def test_a_fused_export_with_4_bit_weights_writes_no_float_matmul_and_validates(tmp_path: Path) -> None:
    """export.weights: each MatMul quantized as the fused writer writes it (no float file, for
    models too large for theirs), checked against its float weight there, validated as int4."""
    doc = yaml.safe_load((DATA / "tiny-llama.yaml").read_text(encoding="utf-8"))
    doc["source"]["huggingface"]["config"]["tie_word_embeddings"] = True
    doc["export"] = {"exporter": "fused", "opset": 23, "with_past": True, "weights": {"bits": 4}}
    folder = _built(tmp_path, doc, ("optimize", "quantize", "generate", "benchmark", "expect"))
    model = onnx.load_model(str(folder / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 2 * 5 + 1 and "MatMul" not in ops
    lookup = next(n for n in model.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    assert lookup.input[0] == "lm_head.weight"  # the tied table, float for the lookup, 4-bit for the head
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["variants"]["model"]["passed"]
    assert validation["variants"]["model"]["atol"] == 3.0  # int4's tolerances, not fp32's 1e-4
    # and its graph at fp32's, against PyTorch on the same dequantized weights (the head's only:
    # the lookup reads the float table)
    graph = validation["variants"]["model"]["graph_check"]
    assert graph["passed"] and graph["matmuls"] == 11 and graph["atol"] == 1e-4
    assert 0 < graph["max_abs_diff"] < 1e-4 and len(graph["shapes"]) == len(validation["variants"]["model"]["shapes"])


def test_a_wrong_graph_on_right_4_bit_weights_fails_the_graph_check(tmp_path: Path) -> None:
    """validating/graphcheck.py: the fused 4-bit file run at float compute agrees with PyTorch
    on its dequantized weights to fp32's tolerances; the same file with one wrong edge (layer
    1's activation on up instead of gate) and every weight right does not, while its rounding
    alone would pass int4's tolerances."""
    import numpy as np
    import torch

    from onnxbuild.sources.checkpoint import replace_weights
    from onnxbuild.steps.exporting.fused import _quantizer, signature
    from onnxbuild.steps.validating import graphcheck

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY_DECODER_SIZES)
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in ("input_ids", "position_ids")]
    inputs.append({"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total"]})
    inputs += [
        {"name": f"past_key_values.{i}.{kv}", "dtype": "float32", "shape": ["batch", 2, "past", 16]}
        for i in range(2)
        for kv in ("key", "value")
    ]
    shape = signature(inputs, ["logits"], {})  # type: ignore[arg-type]
    shape.opset_import[0].version = 23
    with open(tmp_path / "model.onnx.data", "wb") as data:
        built = decoder.build(
            model,
            shape,
            data,
            "model.onnx.data",
            _quantizer({"bits": 4, "block_size": 32, "accuracy_level": 4, "symmetric": True}, []),
        )
    onnx.save_model(built.model, str(tmp_path / "model.onnx"))
    ids = np.array([[3, 14, 15, 92, 65, 35]], dtype=np.int64)
    feeds = {"input_ids": ids, "position_ids": np.arange(6)[None], "attention_mask": np.ones_like(ids)}
    feeds |= {
        f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 16), np.float32) for i in range(2) for kv in ["key", "value"]
    }
    made, matmuls, why = graphcheck.replacements(tmp_path / "model.onnx", model)
    assert not why and matmuls == 11
    replace_weights(model, made)
    with torch.no_grad():
        reference = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    case = [({"batch": 1, "sequence": 6}, feeds, lambda name, x: x)]
    right = graphcheck.compared(tmp_path / "model.onnx", case, [[reference]], ["logits"], matmuls, 1e-3, 1e-4)
    assert right["passed"] and right["max_abs_diff"] < 1e-5

    wrong = onnx.load_model(str(tmp_path / "model.onnx"), load_external_data=False)
    sigmoid = next(n for n in wrong.graph.node if n.name == "/model/layers.1/mlp/act/Sigmoid")
    sigmoid.input[0] = "/model/layers.1/mlp/up"
    onnx.save_model(wrong, str(tmp_path / "model.onnx"))
    caught = graphcheck.compared(tmp_path / "model.onnx", case, [[reference]], ["logits"], matmuls, 1e-3, 1e-4)
    assert caught["passed"] is False and "DISAGREE" in caught["note"]
    assert caught["max_abs_diff"] < 3.0  # inside int4's atol: the variant's own comparison would not see it


def test_a_wrong_quantized_weight_is_caught_where_the_fused_writer_quantizes_it() -> None:
    import numpy as np
    from onnx import helper, numpy_helper

    from onnxbuild.quant.streamed import alone
    from onnxbuild.quant.weightcheck import written
    from onnxbuild.steps.quantizing.nbits import weight_only_proto

    w = (np.random.default_rng(0).standard_normal((64, 48)) * 0.02).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="/m/MatMul")
    q = {"name": "m", "method": "int4", "bits": 4, "block_size": 32, "symmetric": True, "accuracy_level": 4}
    q |= {"algorithm": "rtn", "embedding": False, "keep": [], "exclude_nodes": []}
    right = weight_only_proto(alone(node, w), q)  # type: ignore[arg-type]
    found = written(right, "w", w)
    assert found is not None and found["rel_error"] <= found["rel_max"]
    scales = next(t for t in right.graph.initializer if t.name.endswith("_scales"))
    scales.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scales) * 2, scales.name))
    wrong = written(right, "w", w)
    assert wrong is not None and wrong["rel_error"] > 1.0 > wrong["rel_max"]
