"""An ONNX model as the Hub serves it (huggingface: {model, file: onnx/model.onnx}): built from
a local folder in the repository's layout, and a clear error where the Hub cannot be reached."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import onnxbuild
from onnxbuild.api import load_recipe
from onnxbuild.cli import cli
from onnxbuild.errors import RecipeError


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT saved as a Hub repository that ships ONNX: config.json and onnx/model.onnx."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("hub") / "tiny-bert-onnx"
    config = transformers.BertConfig(
        vocab_size=200,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(folder)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    (folder / "onnx").mkdir()
    ids = torch.randint(0, 200, (2, 8))
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "sequence_length"},
        "last_hidden_state": {0: "batch_size", 1: "sequence_length"},
    }
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice is not this test's concern
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Wrapped(),
            (ids, torch.ones_like(ids)),
            str(folder / "onnx" / "model.onnx"),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
        )
    return folder


RECIPE = """
name: hub-onnx
source:
  huggingface: {{model: {model}, file: onnx/model.onnx, task: feature-extraction}}
optimize:
  transformer: {{model_type: bert}}
quantize:
  - {{name: int8, method: dynamic, from: optimized}}
benchmark:
  iterations: 3
  warmup: 1
  shapes: [{{batch_size: 1, sequence_length: 16}}]
"""


def test_a_hub_layout_folder_builds_through_check_optimize_quantize_and_benchmark(
    hub_folder: Path, tmp_path: Path
) -> None:
    recipe = tmp_path / "hub.yaml"
    recipe.write_text(RECIPE.format(model=hub_folder), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([recipe], settings)
    assert report.ok, report.failures()
    steps = {s["name"]: s for s in report.recipes[0].steps}
    assert list(steps) == ["source", "check", "optimize", "quantize.int8", "machine", "benchmark"]
    assert steps["source"]["data"]["summary"] == "onnx/model.onnx from local folder"
    art = tmp_path / "artifacts" / "hub-onnx"
    assert (art / "model.onnx").read_bytes() == (hub_folder / "onnx" / "model.onnx").read_bytes()
    optimize = json.loads((art / "reports" / "optimize.json").read_text(encoding="utf-8"))
    assert (
        optimize["transformer"]["num_heads"] == 4 and optimize["transformer"]["hidden_size"] == 32
    )  # from the folder's config.json
    bench = json.loads((art / "benchmark.json").read_text(encoding="utf-8"))
    assert {r["variant"] for r in bench["results"]} == {"model", "optimized", "int8"}
    # The file is the identity: an edited model rebuilds, an untouched one does not.
    assert {s["status"] for s in onnxbuild.build([recipe], settings).recipes[0].steps} == {"cached"}


def test_a_hub_id_that_cannot_be_reached_fails_the_source_step_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    recipe = tmp_path / "hub.yaml"
    recipe.write_text(RECIPE.format(model="onnx-community/tiny-bert-onnx"), encoding="utf-8")
    result = CliRunner().invoke(
        cli,
        ["--cache-dir", str(tmp_path / "cache"), "--artifacts-dir", str(tmp_path / "artifacts"), "make", str(recipe)],
    )
    assert result.exit_code == 1, result.output
    assert (
        "step source failed: source.huggingface.file: cannot download onnx/model.onnx of "
        "onnx-community/tiny-bert-onnx@main from the Hugging Face Hub (HF_HUB_OFFLINE is set)" in result.output
    )
    assert "point `model:` at a local folder with the repository's layout" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "validate: {atol: 0.1}\n",
            "validate: applies only to huggingface, pytorch and tensorflow sources (this recipe's source is an "
            "ONNX file, huggingface.file); remove it",
        ),
        (
            "export: {opset: 17}\n",
            "export: applies only to huggingface, pytorch and tensorflow sources (this recipe's source is an ONNX "
            "file, huggingface.file)",
        ),
    ],
)
def test_a_hub_onnx_file_takes_no_export_or_validate_section(tmp_path: Path, extra: str, message: str) -> None:
    recipe = tmp_path / "hub.yaml"
    recipe.write_text(
        "name: x\nsource:\n  huggingface: {model: org/m, file: onnx/model.onnx, task: feature-extraction}\n" + extra,
        encoding="utf-8",
    )
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert message in str(err.value)


@pytest.mark.parametrize("file", ["../model.onnx", "/abs/model.onnx", "onnx/model.bin"])
def test_the_file_is_a_relative_onnx_path_inside_the_repository(tmp_path: Path, file: str) -> None:
    recipe = tmp_path / "hub.yaml"
    recipe.write_text(
        f"name: x\nsource:\n  huggingface: {{model: org/m, file: '{file}', task: feature-extraction}}\n",
        encoding="utf-8",
    )
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert (
        "source.huggingface.file: must be a relative path to an .onnx file inside the repository, e.g. onnx/model.onnx"
        in str(err.value)
    )
