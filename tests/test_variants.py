"""Optimized and quantized variants, each validated, and the benchmark beside PyTorch (tiny GPT-2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

import onnxbuild
from onnxbuild.cli import cli
from onnxbuild.report import benchmark_schema

DATA = Path(__file__).resolve().parent / "data"
RECIPE = "recipes/tiny-variants.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build of the variants recipe, shared by the tests of this module (they only read it)."""
    root = tmp_path_factory.mktemp("variants")
    (root / "recipes").mkdir()
    shutil.copy(DATA / "tiny-variants.yaml", root / RECIPE)
    settings = onnxbuild.Settings(cache_dir=root / ".onnxbuild" / "cache", artifacts_dir=root / "artifacts")
    report = onnxbuild.build([root / RECIPE], settings, jobs=2)
    assert report.ok, report.failures()
    return root


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_variant_is_built_and_validated_with_its_own_tolerances(built: Path) -> None:
    folder = built / "artifacts" / "tiny-variants"
    for rel in ("model.onnx", "optimized/model.onnx", "int8/model.onnx", "int4/model.onnx", "static8/model.onnx"):
        assert (folder / rel).stat().st_size > 0
    validation = read(folder / "reports" / "validation.json")
    assert validation["passed"] is True
    variants = validation["variants"]
    assert sorted(variants) == ["int4", "int8", "model", "optimized", "static8"]
    assert variants["model"]["atol"] == 1e-4
    assert variants["optimized"]["atol"] == 5e-4
    assert variants["int8"]["atol"] == 3.0 and variants["int8"]["top1_min"] == 0.85
    assert variants["int4"]["top1_min"] == 0.80
    # its graph against PyTorch on its own dequantized weights (the traced lm_head, by its node's name)
    graph = variants["int4"]["graph_check"]
    assert graph["passed"] and graph["matmuls"] >= 1 and graph["max_abs_diff"] < 1e-4
    assert variants["int8"]["graph_check"] is None  # dynamic int8: no weight-only MatMul to check
    for name, v in variants.items():
        assert v["passed"], name
        assert len(v["shapes"]) == 3
        assert v["top1"]["tokens"] == 1 * 1 + 2 * 16 + 5 * 33
    # Quantization changes the numbers, the fp32 variants do not.
    assert max(s["outputs"]["logits"]["max_abs_diff"] for s in variants["optimized"]["shapes"]) < 1e-4
    assert max(s["outputs"]["logits"]["max_abs_diff"] for s in variants["int8"]["shapes"]) > 1e-4
    assert "| int8 |" in (folder / "reports" / "validation.md").read_text(encoding="utf-8")


def test_optimize_report_counts_fusions(built: Path) -> None:
    report = read(built / "artifacts" / "tiny-variants" / "reports" / "optimize.json")
    assert report["transformer"] == {"model_type": "gpt2", "num_heads": 4, "hidden_size": 64, "opt_level": 0}
    # a CPU-only recipe: the fused SkipLayerNormalizations are written as Sum + LayerNormalization
    assert report["skip_layer_norm"]["mode"] == "sum" and report["skip_layer_norm"]["split"] >= 2
    assert "SkipLayerNormalization" not in report["op_types"]
    assert report["op_types"]["Sum"] == report["skip_layer_norm"]["split"]
    assert report["nodes_after"] < report["nodes_before"]
    assert report["hardware_bound"] is False and report["cpu_fingerprint"] is None


def test_benchmark_json_matches_its_schema_and_has_a_pytorch_baseline(built: Path) -> None:
    folder = built / "artifacts" / "tiny-variants"
    bench = read(folder / "benchmark.json")
    jsonschema.validate(bench, benchmark_schema())
    assert bench["baseline"][0]["engine"] == "pytorch" and bench["baseline"][0]["attention"] == "sdpa"
    assert bench["baseline"][0]["iterations"] >= 3
    rows = {(r["variant"], r["provider"]) for r in bench["results"]}
    assert rows == {(v, "CPUExecutionProvider") for v in ("model", "optimized", "int8", "int4", "static8")}
    for r in bench["results"]:
        assert r["speedup_vs_pytorch"] == pytest.approx(bench["baseline"][0]["p50_ms"] / r["p50_ms"], rel=1e-2)
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["io_binding"] is False
    assert bench["providers"] == [{"name": "CPUExecutionProvider", "status": "used", "reason": ""}]
    assert (folder / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PyTorch fp32 (eager, sdpa)" in (folder / "benchmark.md").read_text(encoding="utf-8")


def test_changing_only_benchmark_iterations_reruns_only_the_benchmark(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(built)
    settings = onnxbuild.Settings(cache_dir=built / ".onnxbuild" / "cache", artifacts_dir=built / "artifacts")
    recipe = built / RECIPE
    original = recipe.read_text(encoding="utf-8")
    try:
        recipe.write_text(original.replace("iterations: 3", "iterations: 4"), encoding="utf-8")
        plan = onnxbuild.plan([RECIPE], settings)
        would = {s.spec.name: s.reason for s in plan.would_run}
        assert would == {"benchmark": "benchmark.iterations changed 3 -> 4"}
    finally:
        recipe.write_text(original, encoding="utf-8")


def test_providers_command_tells_the_truth() -> None:
    import onnxruntime as ort

    result = CliRunner().invoke(cli, ["providers", "--json"])
    assert result.exit_code == 0, result.output
    found = {p["name"]: p for p in json.loads(result.stdout)}
    assert found["CPUExecutionProvider"]["works"] is True
    if "CUDAExecutionProvider" in ort.get_available_providers() and not _cuda_present():
        assert found["CUDAExecutionProvider"]["works"] is False
        assert "fall back to CPUExecutionProvider" in found["CUDAExecutionProvider"]["reason"]


def _cuda_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.slow  # two builds with a provider that cannot run: make test-slow
def test_an_unusable_provider_is_skipped_and_strict_fails(project: Path) -> None:
    import onnxruntime as ort

    if _cuda_present():
        pytest.skip("this machine has a CUDA device; the skip path needs one without")
    text = (DATA / "tiny-variants.yaml").read_text(encoding="utf-8")
    text = text.split("optimize:")[0].replace("name: tiny-variants", "name: tiny-cuda")
    text += "benchmark: {warmup: 0, iterations: 1, baseline: none, shapes: [{batch: 1, sequence: 4}]}\n"
    text += "providers: [{name: CUDAExecutionProvider}, {name: CPUExecutionProvider}]\n"
    (project / "recipes" / "tiny-cuda.yaml").write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, ["make", "recipes/tiny-cuda.yaml", "--strict-providers"])
    assert result.exit_code == 1, result.output
    assert "--strict-providers: tiny-cuda: provider CUDAExecutionProvider was skipped" in result.stderr
    bench = read(project / "artifacts" / "tiny-cuda" / "benchmark.json")
    cuda = next(p for p in bench["providers"] if p["name"] == "CUDAExecutionProvider")
    assert cuda["status"] == "skipped"
    expected = (
        "not in this onnxruntime build"
        if "CUDAExecutionProvider" not in ort.get_available_providers()
        else "fell back to CPUExecutionProvider"
    )
    assert expected in cuda["reason"]
    assert {r["provider"] for r in bench["results"]} == {"CPUExecutionProvider"}
