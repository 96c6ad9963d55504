"""First-divergence search (issue 19): a wrong weight planted in one node of a quantized
variant is found, named with its module, and cut out as a subgraph that reproduces it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from click.testing import CliRunner
from helpers_tiny import TINY_GPT2_SOURCE
from onnx import numpy_helper

from onnxbuild.cli import cli

RECIPE = {
    "name": "tiny-gpt2",
    "source": TINY_GPT2_SOURCE,
    "export": {"opset": 18},
    "validate": {"shapes": [{"batch": 1, "sequence": 8}]},
    "quantize": [{"name": "int8", "method": "dynamic", "validate": {"atol": 0.5, "rtol": 0.1, "top1_min": 0.5}}],
}


def test_a_planted_wrong_weight_is_named_as_the_first_divergence(project: Path) -> None:
    (project / "recipes" / "explain.yaml").write_text(yaml.safe_dump(RECIPE, sort_keys=False), encoding="utf-8")
    runner = CliRunner()
    built = runner.invoke(cli, ["make", "recipes/explain.yaml"])
    assert built.exit_code == 0, built.output

    clean = runner.invoke(cli, ["explain-mismatch", "recipes/explain.yaml", "--variant", "int8"])
    assert clean.exit_code == 0, clean.output
    assert "no divergence" in clean.output  # the built int8 stays within its tolerances everywhere

    # One weight of the second block's MLP made 1000 times too large (its int8 scale: a
    # wrong calibration, or a bad merge of weights)
    model = onnx.load_model(str(project / "artifacts" / "tiny-gpt2" / "int8" / "model.onnx"))
    (weight,) = [t for t in model.graph.initializer if t.name.endswith("h.1.mlp.c_fc.weight_scale")]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1000, weight.name))
    bad = project / "planted.onnx"
    onnx.save_model(model, str(bad))

    result = runner.invoke(
        cli, ["explain-mismatch", "recipes/explain.yaml", "--variant", "int8", "--file", str(bad), "--out", "found"]
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    final = float(lines[1].rsplit(" ", 1)[1])
    assert final > 0.5  # the final outputs are outside the variant's atol: its validation fails
    first = next(line for line in lines if "first divergence" in line)
    assert "/model/transformer/h.1/mlp/c_fc/" in first, result.output  # the planted node, not one after it
    assert "from module: model.transformer.h.1.mlp.c_fc" in result.output  # the export wraps the model as `model`

    # the subgraph reproduces the divergence alone, from the saved inputs
    subgraphs = sorted((project / "found").glob("*.onnx"))
    assert len(subgraphs) == 1
    sub = onnx.load_model(str(subgraphs[0]))
    assert len(sub.graph.node) <= 8  # that node and what it needs, not the model
    inputs = dict(np.load(str(subgraphs[0]).replace(".onnx", ".inputs.npz")))
    session = ort.InferenceSession(str(subgraphs[0]), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})
    assert np.isfinite(out).all() and out.size > 0


@pytest.mark.slow  # 18 s on 2 cores; the search itself is also test_a_planted_wrong_weight_is_named_...
def test_a_failing_validation_names_the_first_node_that_parts_from_the_base_and_keeps_its_subgraph(
    project: Path,
) -> None:
    """int8 held to float32's tolerance fails; the failure says where it first departs."""
    strict = json.loads(json.dumps(RECIPE))
    strict["quantize"][0]["validate"] = {"atol": 1.0e-5, "rtol": 0.0}
    (project / "recipes" / "strict.yaml").write_text(yaml.safe_dump(strict, sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(cli, ["make", "recipes/strict.yaml"])
    assert result.exit_code == 1, result.output
    message = next(line for line in result.output.splitlines() if "step validate.int8 failed" in line)
    # dynamic int8 quantizes the token embedding too: the first quantized weight the input meets
    assert (
        "First node where it parts from model: /model/transformer/wte/" in message
        and "from model.transformer.wte)" in message
    )
    assert "artifacts/tiny-gpt2/failed/validate.int8/divergence/" in message
    kept = project / "artifacts" / "tiny-gpt2" / "failed" / "validate.int8" / "divergence"
    assert len(list(kept.glob("*.onnx"))) == 1 and len(list(kept.glob("*.inputs.npz"))) == 1


def test_a_graph_source_variant_is_searched_with_seeded_inputs(project: Path) -> None:
    """onnx and graph sources have no validation (no torch model): the search still runs,
    with the variant's default tolerances, and says its inputs are not a validation case's."""
    text = (project / "recipes" / "linear-regression.yaml").read_text(encoding="utf-8")
    (project / "recipes" / "lr-int8.yaml").write_text(
        text + "quantize:\n  - {name: int8, method: dynamic}\n", encoding="utf-8"
    )
    runner = CliRunner()
    built = runner.invoke(cli, ["make", "recipes/lr-int8.yaml"])
    assert built.exit_code == 0, built.output
    result = runner.invoke(cli, ["explain-mismatch", "recipes/lr-int8.yaml", "--variant", "int8"])
    assert result.exit_code == 0, result.output
    assert (
        "int8 (artifacts/linear-regression/int8/model.onnx) against model at the sample, seeded inputs "
        "(validation runs no such case) (atol 3, rtol 0.5)" in result.output
    )
    assert "no divergence: 2 shared tensors compared" in result.output
