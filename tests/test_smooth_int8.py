"""``method: smooth_int8`` (steps/quantizing/smooth.py) end to end on a tiny Llama given outlier
channels on purpose, as trained LLMs have them.

The model (2 layers, hidden 64, seeded): channel 5 of every norm's weight is 40x, and the rows
of the weights that read it are 1/40x, so the float model computes what it did, but every
MatMul input has one channel 40x the others. onnxruntime's dynamic int8 gives the whole
activation one scale, which that channel takes: the other channels keep few levels. SmoothQuant
moves the channel's size into the weights, so the file computes closer to the float one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.helpers_cli import run
from tests.helpers_tiny import TINY_DECODER_SIZES

RECIPE = """name: s
source:
  huggingface:
    model: model
    task: text-generation
export: {opset: 18, with_past: true}
validate:
  shapes: [{batch: 1, sequence: 8}]
optimize: {decoder: fused}
quantize:
  - name: smooth
    method: smooth_int8
    from: optimized
    keep: [lm_head]
    keep_worst: 1
    calibration: {samples: 4, window: 32}
    validate: {top1_min: 0.3}   # seeded weights: near-flat logits on random ids, as llama-125m's int8
"""
OUTLIER, TIMES = 5, 40.0


def outlier_llama(folder: Path) -> None:
    import torch
    import transformers

    config = transformers.LlamaConfig(**TINY_DECODER_SIZES, initializer_range=0.05, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm, readers in (
                (layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)),
                (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj)),
            ):
                norm.weight[OUTLIER] *= TIMES
                for linear in readers:
                    linear.weight[:, OUTLIER] /= TIMES
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smooth")
    outlier_llama(root / "model")
    (root / "s.yaml").write_text(RECIPE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HF_HUB_OFFLINE", "1")
        result = run("--cache-dir", str(root / "cache"), "make", "s.yaml", "--lock")
    assert result.exit_code == 0, result.output
    return root


def logits(path: Path, ids: Any) -> Any:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
    }
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, 2, 0, 16), np.float32)
    return session.run(["logits"], {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})[0]


def test_smoothing_brings_dynamic_int8_back_near_the_float_file(built: Path) -> None:
    from onnxbuild.steps.quantizing.int8 import dynamic

    art = built / "artifacts" / "s"
    plain = built / "plain-dynamic.onnx"
    q: Any = {"op_types": None, "per_channel": True, "reduce_range": False, "weight_type": "int8"}
    dynamic(art / "optimized" / "model.onnx", plain, {**q, "exclude_nodes": [], "keep": []})
    ids = np.random.default_rng(1).integers(0, 1000, size=(1, 32), dtype=np.int64)
    exact = logits(art / "optimized" / "model.onnx", ids)
    plain_error = float(np.abs(logits(plain, ids) - exact).mean())
    smooth_error = float(np.abs(logits(art / "smooth" / "model.onnx", ids) - exact).mean())
    assert smooth_error < 0.5 * plain_error, (smooth_error, plain_error)


def test_the_plan_folds_each_outlier_into_its_norm_and_keeps_the_worst_at_8_bits(built: Path) -> None:
    art = built / "artifacts" / "s"
    plan = json.loads((art / "reports" / "quantize" / "smooth.json").read_text(encoding="utf-8"))
    by_first = {g["matmuls"][0]: g for g in plan["groups"]}
    for layer in (0, 1):
        for first in (f"/model/layers.{layer}/attn/qkv_proj/MatMul", f"/model/layers.{layer}/mlp/gate_proj/MatMul"):
            assert by_first[first]["folded"] == "norm" and by_first[first]["alpha"] > 0, by_first[first]
    assert by_first["/model/layers.0/attn/o_proj/MatMul"]["folded"] in ("mul", "not smoothed: alpha 0 rounds best")
    down = by_first["/model/layers.0/mlp/down_proj/MatMul"]["folded"]
    assert down in ("up", "not smoothed: alpha 0 rounds best")
    # keep: [lm_head] and the one layer input of largest simulated error (not lm_head's) at 8 bits
    ranked = sorted((g for g in plan["groups"] if "lm_head" not in g["matmuls"][0]), key=lambda g: -g["error"])
    assert set(plan["kept"]) == {*ranked[0]["matmuls"], "/lm_head/MatMul"}
    model = onnx.load_model(str(art / "smooth" / "model.onnx"))
    nbits = [n.name for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == len(plan["kept"]) and plan["dynamic"] == 11 - len(plan["kept"])
    lock = json.loads((built / "s.lock.json").read_text(encoding="utf-8"))["steps"]["quantize.smooth"]["record"]
    assert lock["kept"] == {k: 8 for k in plan["kept"]}
    assert lock["alphas"] == {g["matmuls"][0]: g["alpha"] for g in plan["groups"]}
