"""The main job, recipes/gpt2.yaml, end to end: GPT-2 small (124M) with every variant.

Marked slow (about 3 minutes on 2 cores); `make test` runs it, `make test-fast` skips it.
Latency ratios are printed by `make bench`, not asserted here: timed assertions on
shared machines are noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import onnxbuild

pytestmark = pytest.mark.slow


def test_gpt2_recipe_builds_validates_every_variant_and_benchmarks(project: Path, settings: onnxbuild.Settings) -> None:
    report = onnxbuild.build(["recipes/gpt2.yaml"], settings)
    assert report.ok, report.failures()
    folder = project / "artifacts" / "gpt2"
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert validation["passed"] and validation["weights"] == "random-init"
    model = validation["variants"]["model"]
    assert len(model["shapes"]) >= 3
    assert max(s["outputs"]["logits"]["max_abs_diff"] for s in model["shapes"]) <= 1e-4
    assert sorted(validation["variants"]) == ["int4", "int8", "model", "optimized"]
    check = json.loads((folder / "reports" / "check.json").read_text(encoding="utf-8"))
    assert check["parameters"] > 124_000_000
    bench = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
    assert {r["variant"] for r in bench["results"]} == {"model", "optimized", "int8", "int4"}
    assert [b["shape"]["sequence"] for b in bench["baseline"]] == [32, 128]
    timings = json.loads((folder / "timings.json").read_text(encoding="utf-8"))["steps"]
    assert max(t["peak_rss_mb"] or 0 for t in timings.values()) < 4096
    again = onnxbuild.build(["recipes/gpt2.yaml"], settings)
    assert {s["status"] for s in again.recipes[0].steps} == {"cached"}
