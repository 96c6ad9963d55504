"""An accuracy budget picks the layers to keep at higher precision (steps/budget.py), end to
end on a tiny Llama made sensitive in one layer on purpose: that layer, and no other, stays
at 8 bits; the plan is in the report, the step's summary and the lock, and the same inputs
give the same plan. The search and its messages on numbers alone are in test_text_quality.py.

The model (2 layers, hidden 64, seeded): in layer 1's MLP, one input channel of down_proj per
block of 32 carries nothing (its gate row is zero, so silu(0) * up = 0) and holds a weight 8x
the layer's largest. The output never sees those weights, but they set their blocks' 4-bit
scale, which then rounds the block's other weights away: the layer's output error is ~100% at
4 bits and small at 8, where every other MatMul's is ~1%. Measured: mean KL from the float
file on the calibration windows 0.0129 with all 11 MatMuls at 4 bits, 0.0036 with that one at 8,
0.0031 with two; the plan's target (0.005: the budget of 0.01 times budget.margin 0.5) lies between.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import helper

from tests.helpers_cli import run

SENSITIVE = "/model/layers.1/mlp/down_proj/MatMul"

RECIPE = """name: b
source:
  huggingface:
    model: model
    task: text-generation
export: {opset: 18, with_past: true}
validate:
  shapes: [{batch: 1, sequence: 8}]
optimize: {decoder: fused}
quantize:
  - name: int4
    method: int4
    from: optimized
    block_size: 32
    budget: {kld_max: 0.01}
    calibration: {samples: 4, window: 32}
    validate: {top1_min: 0.3}   # seeded weights: near-flat logits on random ids, as llama-125m's int4
"""


def sensitive_llama(folder: Path) -> None:
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.05,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        mlp = model.model.layers[1].mlp
        dead = [0, 32, 64, 96]
        mlp.gate_proj.weight[dead, :] = 0.0
        mlp.down_proj.weight[:, dead] = 8 * mlp.down_proj.weight.abs().max()
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget")
    sensitive_llama(root / "model")
    (root / "b.yaml").write_text(RECIPE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HF_HUB_OFFLINE", "1")
        result = run("--cache-dir", str(root / "cache"), "make", "b.yaml", "--lock")
    assert result.exit_code == 0, result.output
    assert "budget kld_max 0.01: 1 of 11 MatMuls kept at 8 bits" in result.output
    return root


def bits_by_node(path: Path) -> dict[str, int]:
    model = onnx.load_model(str(path), load_external_data=False)
    return {
        n.name: helper.get_attribute_value(next(a for a in n.attribute if a.name == "bits"))
        for n in model.graph.node
        if n.op_type == "MatMulNBits"
    }


def test_the_sensitive_layer_and_no_other_stays_at_8_bits(built: Path) -> None:
    plan = json.loads((built / "artifacts" / "b" / "reports" / "quantize" / "int4.json").read_text(encoding="utf-8"))
    assert [k["node"] for k in plan["kept"]] == [SENSITIVE] and plan["kept"][0]["bits"] == 8
    assert plan["matmuls"] == 11 and plan["figures"]["kld_mean"] <= 0.005  # planned to margin 0.5 of the budget
    others = [c for c in plan["tried"] if c["kept"] == 0]
    assert others and others[0]["kld_mean"] > 0.01  # every MatMul at 4 bits misses the budget itself
    bits = bits_by_node(built / "artifacts" / "b" / "int4" / "model.onnx")
    assert len(bits) == 11
    assert {name.removesuffix("_Q8").removesuffix("_Q4"): b for name, b in bits.items() if b == 8} == {SENSITIVE: 8}


def test_the_plan_is_in_the_lock_so_a_review_sees_which_layers_changed_precision(built: Path) -> None:
    lock = json.loads((built / "b.lock.json").read_text(encoding="utf-8"))
    step = lock["steps"]["quantize.int4"]
    assert step["record"]["kept"] == {SENSITIVE: 8}
    assert step["record"]["figures"]["kld_mean"] <= 0.005


def test_the_same_inputs_give_the_same_plan(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = (built / "artifacts" / "b" / "reports" / "quantize" / "int4.json").read_bytes()
    model = (built / "artifacts" / "b" / "int4" / "model.onnx").read_bytes()
    monkeypatch.chdir(built)
    result = run(
        "--cache-dir", str(built / "cache"), "make", "b.yaml", "--target", "quantize.int4", "--force", "--single"
    )
    assert result.exit_code == 0, result.output
    assert (built / "artifacts" / "b" / "reports" / "quantize" / "int4.json").read_bytes() == first
    assert (built / "artifacts" / "b" / "int4" / "model.onnx").read_bytes() == model
