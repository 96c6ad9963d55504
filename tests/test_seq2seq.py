"""An encoder-decoder's two files (onnxbuild/sources/seq2seq.py): the encoder computes every
decoder layer's cross-attention keys and values once, the decoder reads them at each step
instead of the encoder's hidden states, greedy generation over the files is transformers'
generate() token for token, and ONNX Runtime's bart fusions turn Whisper's attention into
Attention (encoder) and MultiHeadAttention (decoder: self and cross) nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml

import onnxbuild
from tests.helpers_artifacts import signature

TASKS = Path(__file__).resolve().parent / "data" / "tasks"


def ops(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_whisper_decodes_from_cross_keys_the_encoder_computed_once_and_fuses_its_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # random-init weights from the recipe's config
    doc = yaml.safe_load((TASKS / "tiny-whisper.yaml").read_text(encoding="utf-8"))
    doc.pop("quantize")
    doc["validate"] = {"shapes": [{"batch": 2, "decoder_sequence": 3}]}
    doc["optimize"] = {"level": "basic", "transformer": {}}
    # 2 encoder self-attentions; the decoder's 2 self- and 2 cross-attentions
    doc["expect"] = {"optimized": {"ops": {"Attention": 2, "MultiHeadAttention": 4}, "absent": ["Softmax"]}}
    recipe = tmp_path / "tiny-whisper.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([recipe], settings)
    assert report.ok, report.failures()
    folder = tmp_path / "artifacts" / "tiny-whisper"

    encoder, decoder = signature(folder / "encoder_model.onnx"), signature(folder / "decoder_model.onnx")
    assert encoder["last_hidden_state"] == ["batch", 32, 64]
    assert [n for n in encoder if "cross" in n] == [
        "present_key_cross_0",
        "present_value_cross_0",
        "present_key_cross_1",
        "present_value_cross_1",
    ]
    assert encoder["present_value_cross_1"] == ["batch", 4, 32, 16]  # [batch, heads, encoder positions, head_dim]
    assert "encoder_hidden_states" not in decoder and "encoder_attention_mask" not in decoder
    assert decoder["past_key_cross_0"] == decoder["past_value_cross_1"] == ["batch", 4, 32, 16]
    assert decoder["past_key_values.0.key"] == ["batch", 4, "past_sequence", 16]
    assert [n for n in decoder if n.startswith("present")] == [
        f"present.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")
    ]

    generation = read(folder / "reports" / "generation.json")
    pytorch = generation["pytorch"]["greedy_tokens"]
    assert len(pytorch) == 8 and len(set(pytorch)) >= 3  # random weights that say something
    for variant in ("model", "optimized"):
        greedy = generation["variants"][variant]["greedy"]
        assert greedy["identical"] and greedy["tokens"] == pytorch, variant
    validation = read(folder / "reports" / "validation.json")["variants"]
    outputs = validation["model"]["shapes"][0]["outputs"]
    assert {"encoder.present_key_cross_0", "encoder.present_value_cross_1", "decoder.present.1.value"} <= set(outputs)
    assert validation["optimized"]["passed"]

    assert ops(folder / "optimized" / "decoder_model.onnx").get("MultiHeadAttention") == 4
    assert ops(folder / "optimized" / "encoder_model.onnx").get("Attention") == 2
    files = read(folder / "reports" / "optimize.json")["files"]
    assert files["decoder_model.onnx"]["fused_ops"]["MultiHeadAttention"] == 4
    assert all(c["ok"] for c in read(folder / "reports" / "expect" / "optimized.json")["checks"])


@pytest.mark.parametrize(("recipe", "attention"), [("tiny-t5", 6), ("tiny-marian", 6)])
def test_eager_attention_ort_misses_is_written_as_onnx_attention(
    recipe: str, attention: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T5 (position bias and mask added one after the other) and Marian (a biased key
    projection, a masked cross attention) match none of ORT's attention patterns on
    transformers 5 graphs; fusion/attention.py writes each as ONNX's Attention: 2 encoder
    self-attentions, the decoder's 2 self- and 2 cross-attentions, and no Softmax left."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    doc = yaml.safe_load((TASKS / f"{recipe}.yaml").read_text(encoding="utf-8"))
    doc.pop("quantize", None)
    doc["validate"] = {"shapes": [{"batch": 2, "sequence": 5, "decoder_sequence": 3}]}
    doc["optimize"] = {"level": "basic", "transformer": {}}
    doc["expect"] = {"optimized": {"ops": {"Attention": attention}, "absent": ["Softmax"]}}
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([path], settings)
    assert report.ok, report.failures()
    folder = tmp_path / "artifacts" / recipe
    files = read(folder / "reports" / "optimize.json")["files"]
    assert [files[f]["attention_rewritten"] for f in ("encoder_model.onnx", "decoder_model.onnx")] == [2, 4]
    counts = [ops(folder / "optimized" / f)["Attention"] for f in ("encoder_model.onnx", "decoder_model.onnx")]
    assert counts == [2, 4]
    generation = read(folder / "reports" / "generation.json")["variants"]
    assert generation["optimized"]["greedy"]["identical"] and generation["model"]["greedy"]["identical"]
