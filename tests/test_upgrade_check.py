"""Dependency-bump report (issue 19): `onnxbuild upgrade-check` builds a recipe here and with
another onnxruntime (pip-installed into a throwaway virtual environment over this one's
packages) and reports, per artifact, bytes, validation figures, fused ops and latency.

Needs PyPI (the package registries are reachable on the project's machines); it installs
one onnxruntime wheel (~17 MB) once per run.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime
import pytest
import yaml
from click.testing import CliRunner
from helpers_tiny import TINY_GPT2_SOURCE

from onnxbuild.cli import cli

pytestmark = pytest.mark.slow  # builds twice, once in a throwaway environment with another onnxruntime: make test-slow

RECIPE = {
    "name": "tiny-gpt2",
    "source": TINY_GPT2_SOURCE,
    "export": {"opset": 18},
    "validate": {"shapes": [{"batch": 1, "sequence": 8}]},
    "optimize": {"level": "basic"},
    "quantize": [{"name": "int8", "method": "dynamic", "from": "optimized", "validate": {"top1_min": 0.5}}],
    "benchmark": {"iterations": 5, "warmup": 1, "shapes": [{"batch": 1, "sequence": 8}]},
}


def test_upgrade_check_reports_each_artifact_with_another_onnxruntime(project: Path) -> None:
    here = onnxruntime.__version__  # the module's: CI installs onnxruntime-gpu
    other = "1.30.0" if here != "1.30.0" else "1.31.1"
    (project / "recipes" / "bump.yaml").write_text(yaml.safe_dump(RECIPE, sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["upgrade-check", "recipes/bump.yaml", "--with", f"onnxruntime=={other}", "--out", "bump.md"]
    )
    assert result.exit_code == 0, result.output
    report = (project / "bump.md").read_text(encoding="utf-8")
    assert report == result.output
    assert report.startswith(f"## Dependency check: onnxruntime {here} -> {other}")
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| `")}
    assert set(rows) == {"`model.onnx`", "`optimized/model.onnx`", "`int8/model.onnx`"}
    assert "| identical |" in rows["`model.onnx`"]  # the export does not use onnxruntime
    assert " ms (" in rows["`int8/model.onnx`"]  # latency on both sides
    assert "(same)" in rows["`model.onnx`"]  # validation of the same file: the same figures
    # nothing built here was touched: the other side has its own cache and artifacts
    assert (project / ".onnxbuild" / "upgrade").is_dir()
    assert (project / "artifacts" / "tiny-gpt2" / "int8" / "model.onnx").is_file()
