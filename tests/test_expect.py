"""Graph contracts (``expect:``, issue 19): checked right after the step that writes each file.

A tiny GPT-2 with a fused graph and int8/int4 variants declares its contracts and builds;
the same recipe with the fusion turned off (``optimize.decoder: export``) fails the build,
and the message names the fusion that is missing, what was expected and what was found.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers_tiny import TINY_GPT2_SOURCE

from onnxbuild.cli import cli

TINY_GPT2 = {
    "name": "tiny-gpt2",
    "source": TINY_GPT2_SOURCE,
    "export": {"opset": 18, "with_past": True},
    "validate": {"shapes": [{"batch": 1, "sequence": 8}]},
    # fused: these contracts are about SkipLayerNormalization firing (on a CPU-only recipe
    # auto would write Sum + LayerNormalization)
    "optimize": {"level": "basic", "skip_layer_norm": "fused"},
    "quantize": [
        {"name": "int8", "method": "dynamic", "from": "optimized", "validate": {"top1_min": 0.5}},
        {"name": "int4", "method": "int4", "from": "optimized", "block_size": 32, "validate": {"top1_min": 0.3}},
    ],
    "expect": {
        "all": {
            "inputs": {"input_ids": "int64[batch, sequence]"},
            "outputs": {"logits": "float32[batch, sequence, 1000]"},
        },
        "model": {"opset": 18},  # the fused graph is written at opset 20
        "optimized": {
            "ops": {"Attention": 2, "SkipLayerNormalization": ">= 4", "Gelu": 2},
            "absent": ["GroupQueryAttention"],
            "weights": {"float32": 0.99},
        },
        "int8": {"weights": {"int8": 0.3}, "max_mb": 1.0},
        "int4": {"weights": {"int4": 0.1}},
    },
}


def _write(project: Path, doc: dict[str, object]) -> str:
    path = project / "recipes" / "contracts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return "recipes/contracts.yaml"


def test_the_contracts_hold_and_each_rule_is_reported(project: Path) -> None:
    result = CliRunner().invoke(cli, ["make", _write(project, TINY_GPT2)])
    assert result.exit_code == 0, result.output
    reports = project / "artifacts" / "tiny-gpt2" / "reports" / "expect"
    assert sorted(p.name for p in reports.iterdir()) == ["int4.json", "int8.json", "model.json", "optimized.json"]
    optimized = json.loads((reports / "optimized.json").read_text(encoding="utf-8"))["checks"]
    by_rule = {c["rule"]: c for c in optimized}
    assert by_rule["expect.optimized.ops.Attention"] == {
        "rule": "expect.optimized.ops.Attention",
        "expected": "== 2",
        "actual": 2,
        "ok": True,
    }
    assert by_rule["expect.optimized.inputs.input_ids"]["actual"] == "int64[batch, sequence]"  # from all:, merged in
    assert all(c["ok"] for c in optimized) and len(optimized) == 7
    int4 = json.loads((reports / "int4.json").read_text(encoding="utf-8"))["checks"]
    (share,) = [c for c in int4 if c["rule"] == "expect.int4.weights.int4"]
    assert share["ok"] and float(share["actual"].rstrip("%")) > 10


@pytest.mark.slow  # a second optimized build with a fusion switched off: make test-slow
def test_a_fusion_that_stops_firing_fails_the_build_naming_it(project: Path) -> None:
    doc = json.loads(json.dumps(TINY_GPT2))
    doc["optimize"]["decoder"] = "export"  # ONNX Runtime's optimizer on the export: no attention fused
    result = CliRunner().invoke(cli, ["make", "--keep-going", _write(project, doc)])
    assert result.exit_code == 1, result.output
    assert "expect.optimized.ops.Attention: expected == 2, found 0" in result.output
    assert "expect.optimized.ops.SkipLayerNormalization: expected >= 4, found 0" in result.output
    assert (
        "expect.optimized.absent" not in result.output and "expect.int8." not in result.output
    )  # the rules that hold are not named
    # the export's own graph leaves most of its weights outside MatMulNBits: the 4-bit file is
    # mostly float32, and its weights rule says so
    assert "expect.int4.weights.int4: expected >= 10% of the weight bytes, found 4.4%" in result.output
