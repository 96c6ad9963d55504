"""CUDA paths: export on the GPU, an fp16 variant, and benchmarks with and without IOBinding.

CI has no GPU: every test here skips, saying why, unless torch sees a CUDA device and
ONNX Runtime's CUDA provider actually runs (not just listed, as onnxruntime-gpu lists it
everywhere). Run them on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import onnxbuild

ROOT = Path(__file__).resolve().parent.parent


def _cuda_reason() -> str | None:
    import torch

    from onnxbuild.runtimes.providers import probe

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    status = next(iter(probe(["CUDAExecutionProvider"])), None)
    if status is None or not status.works:
        return f"ONNX Runtime's CUDA provider does not run here ({status.reason if status else 'not listed'})"
    return None


REASON = _cuda_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"needs a GPU: {REASON}")]

RECIPE = (
    (ROOT / "recipes" / "tiny-gpt2.yaml")
    .read_text(encoding="utf-8")
    .replace("export:\n", "export:\n  device: cuda\n", 1)
    + """
optimize:
  transformer: {model_type: gpt2}
  float16: {keep_io_types: true}
benchmark:
  iterations: 5
  warmup: 2
  shapes: [{batch: 1, sequence: 32}]
providers:
  - {name: CUDAExecutionProvider, options: {device_id: 0}}
  - {name: CPUExecutionProvider}
"""
)


def test_cuda_export_fp16_variant_and_bound_and_unbound_benchmarks(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "gpu.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    report = onnxbuild.build(
        [recipe], onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    )
    assert report.ok, report.failures()
    folder = tmp_path / "artifacts" / "tiny-gpt2"
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["variants"]["optimized"]["atol"] == 0.2  # fp16 tolerances
    bench = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
    assert {p["name"]: p["status"] for p in bench["providers"]}["CUDAExecutionProvider"] == "used"
    cuda = [r for r in bench["results"] if r["provider"] == "CUDAExecutionProvider" and "p50_ms" in r]
    assert {(r["variant"], r["io_binding"]) for r in cuda} == {
        (v, b) for v in ("model", "optimized") for b in (False, True)
    }
    shutil.rmtree(tmp_path / "cache")
