"""Issue 51: recipes/llama-3.2-1b.yaml, a Llama-3.2-1B shape (1.24B parameters, 4.94 GB in fp32),
built whole on a 2-core, 24 GB machine: the fused graph from streamed random-init weights with
no trace, an 8-bit and a 4-bit weight-only variant, each validated against PyTorch at a prefill
and a decode step, and greedy tokens identical to transformers'. Each step's peak RSS within
6.5 GB (1.3x the fp32 weights). About 5 minutes and 15 GB of disk here: make test-slow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import onnxbuild

PEAK_MB = 6500
"""The issue's bound for a 1B model: 1.3x its fp32 weights."""


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow  # a 1B model built whole: make test-slow
def test_a_1b_llama_builds_validates_and_generates_within_its_memory_bound(
    project: Path, settings: onnxbuild.Settings
) -> None:
    try:
        report = onnxbuild.build(["recipes/llama-3.2-1b.yaml"], settings, jobs=1)
        assert report.ok, report.failures()
        folder = settings.artifacts_dir / "llama-3.2-1b"
        steps = read(folder / "timings.json")["steps"]
        over = {name: s["peak_rss_mb"] for name, s in steps.items() if s["peak_rss_mb"] > PEAK_MB}
        assert not over, f"steps above {PEAK_MB} MB: {over}"
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
        source = read(folder / "reports" / "source.json")
        assert source["weights"] == "random-init" and source["weights_file"] == "weights/model.safetensors"
    finally:  # 15 GB of cache and artifacts: not left in pytest's kept temporary folders
        shutil.rmtree(project / ".onnxbuild", ignore_errors=True)
        shutil.rmtree(project / "artifacts", ignore_errors=True)
