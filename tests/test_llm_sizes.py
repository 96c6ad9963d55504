"""Issue 51: LLMs at the sizes people ship, each recipe built whole on a 2-core, 24 GB machine
(make test-slow; recipes/llama-3.1-8b.yaml, 18 minutes and 23 GB of disk, is built by
`python bench/sizes.py recipes/llama-3.1-8b.yaml`).

- recipes/llama-3.2-1b.yaml (1.24B parameters, 4.94 GB in fp32): the fused graph from streamed
  random-init weights with no trace, an 8-bit and a 4-bit weight-only variant, each validated
  against PyTorch at a prefill and a decode step, and greedy tokens identical to transformers'.
  Each step within 6.5 GB (1.3x the fp32 weights). About 5 minutes and 15 GB of disk.
- recipes/llama-3.2-3b.yaml (3.21B, a bf16 checkpoint): 4-bit weights written straight from it,
  no float file; each step within 8 GB. About 6 minutes and 10 GB of disk."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

import onnxbuild

PEAK_MB = 6500
"""The issue's bound for a 1B model: 1.3x its fp32 weights."""
PEAK_3B_MB = 8000


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@contextlib.contextmanager
def built(project: Path, settings: onnxbuild.Settings, name: str, peak_mb: int) -> Iterator[Path]:
    """recipes/<name>.yaml built whole, each step's peak RSS within ``peak_mb``; its artifacts
    folder, removed afterwards with the cache (10-15 GB: not left in pytest's kept folders)."""
    try:
        report = onnxbuild.build([f"recipes/{name}.yaml"], settings, jobs=1)
        assert report.ok, report.failures()
        folder = settings.artifacts_dir / name
        steps = read(folder / "timings.json")["steps"]
        over = {step: s["peak_rss_mb"] for step, s in steps.items() if s["peak_rss_mb"] > peak_mb}
        assert not over, f"steps above {peak_mb} MB: {over}"
        source = read(folder / "reports" / "source.json")
        assert source["weights"] == "random-init" and source["weights_file"] == "weights/model.safetensors"
        yield folder
    finally:
        shutil.rmtree(project / ".onnxbuild", ignore_errors=True)
        shutil.rmtree(project / "artifacts", ignore_errors=True)


@pytest.mark.slow  # a 1B model built whole: make test-slow
def test_a_1b_llama_builds_validates_and_generates_within_its_memory_bound(
    project: Path, settings: onnxbuild.Settings
) -> None:
    with built(project, settings, "llama-3.2-1b", PEAK_MB) as folder:
        # the tied embedding written once: the fp32 weights and no second 1.05 GB table
        data = (folder / "model.onnx.data").stat().st_size
        assert 4.9e9 < data < 5.0e9, data
        validation = read(folder / "reports" / "validation.json")
        for name in ("model", "int8", "int4"):
            variant = validation["variants"][name]
            assert variant["passed"], name
            shapes = variant["shapes"]
            assert any(s["shape"].get("past_sequence") for s in shapes) and len(shapes) >= 2
        assert validation["variants"]["int4"]["weights"]["checked"] == 16 * 5 + 1
        generation = read(folder / "reports" / "generation.json")
        assert generation["variants"]["model"]["greedy"]["tokens"] == generation["pytorch"]["greedy_tokens"]


@pytest.mark.slow  # a 3B model built whole: make test-slow
def test_a_3b_llama_in_4_bits_builds_with_no_float_file_within_8_gb(
    project: Path, settings: onnxbuild.Settings
) -> None:
    with built(project, settings, "llama-3.2-3b", PEAK_3B_MB) as folder:
        model = onnx.load_model(str(folder / "model.onnx"), load_external_data=False)
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("MatMulNBits") == 28 * 5 + 1 and "MatMul" not in ops  # no float MatMul weight
        assert (folder / "model.onnx.data").stat().st_size < 4e9  # 12.9 GB in fp32
        assert read(folder / "reports" / "validation.json")["variants"]["model"]["passed"]
        config = read(folder / "weights" / "config.json")
        assert "bfloat16" in (config.get("dtype"), config.get("torch_dtype"))
