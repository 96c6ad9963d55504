"""recipes/llama-125m.yaml end to end: a Llama-architecture decoder with GPT-2-small
dimensions (12 layers, hidden 768, GQA 12/4, vocab 32000), fused from its weights.

Marked slow (about 2 minutes on 2 cores): `make test-slow` (CI) runs it. The latency
comparison with onnxruntime-genai's model builder is `make bench` (bench/decoders.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest
from onnx import helper

import onnxbuild

pytestmark = pytest.mark.slow


def test_llama_125m_builds_fused_validates_every_variant_and_generates_like_pytorch(
    project: Path, settings: onnxbuild.Settings
) -> None:
    report = onnxbuild.build(["recipes/llama-125m.yaml"], settings, jobs=2)
    assert report.ok, report.failures()
    folder = project / "artifacts" / "llama-125m"
    ops = Counter(
        n.op_type
        for n in onnx.load_model(str(folder / "optimized" / "model.onnx"), load_external_data=False).graph.node
    )
    expected = {
        "Attention": 12,
        "RotaryEmbedding": 24,
        "SkipSimplifiedLayerNormalization": 24,
        "SimplifiedLayerNormalization": 1,
    }
    missing = [f"{op}: expected {n}, found {ops.get(op, 0)}" for op, n in expected.items() if ops.get(op, 0) != n]
    assert not missing, f"fusions that stopped firing: {missing}"
    optimize = json.loads((folder / "reports" / "optimize.json").read_text(encoding="utf-8"))
    assert optimize["fused_ops"] == expected and optimize["decoder"]["family"] == "llama"
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["passed"] and sorted(validation["variants"]) == ["int4", "int8", "model", "optimized"]
    fused = validation["variants"]["optimized"]["shapes"]
    assert [s["shape"].get("left_padding", 0) for s in fused] == [0] * 6 + [
        16
    ] * 2  # 3 shapes x prefill/decode, then the left-padded batch (at batch 2, sequence 32)
    assert (
        all(s["passed"] for s in fused) and max(c["max_abs_diff"] for s in fused for c in s["outputs"].values()) < 1e-4
    )
    generation = json.loads((folder / "reports" / "generation.json").read_text(encoding="utf-8"))
    for name in ("model", "optimized"):
        assert generation["variants"][name]["greedy"]["tokens"] == generation["pytorch"]["greedy_tokens"]
    assert 0.0 <= generation["variants"]["int4"]["teacher_forced_agreement"] <= 1.0
    int4 = onnx.load_model(str(folder / "int4" / "model.onnx"), load_external_data=False)
    nbits = [n for n in int4.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 12 * 5 + 1 and all(
        helper.get_attribute_value(next(a for a in n.attribute if a.name == "accuracy_level")) == 4 for n in nbits
    )
    bench = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
    assert {d["variant"] for d in bench["decode"] if d["engine"] == "onnxruntime"} == {
        "model",
        "optimized",
        "int8",
        "int4",
    }
