"""Bad models: each failure names the step and the cause in one paragraph, exits 1, keeps what was built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from onnxbuild.cli import cli


def onnx_recipe(project: Path, model_bytes: bytes) -> str:
    (project / "recipes" / "broken.onnx").write_bytes(model_bytes)
    (project / "recipes" / "broken.yaml").write_text(
        "name: broken\nsource:\n  onnx: {path: broken.onnx}\n", encoding="utf-8"
    )
    return "recipes/broken.yaml"


def invalid_model() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    node = helper.make_node("Add", ["x", "nowhere"], ["y"])  # "nowhere" is never defined
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), ir_version=10, opset_imports=[helper.make_opsetid("", 18)]
    )
    return bytes(model.SerializeToString())


def test_a_model_the_checker_rejects_fails_the_check_step(project: Path) -> None:
    recipe = onnx_recipe(project, invalid_model())
    result = CliRunner().invoke(cli, ["make", recipe])
    assert result.exit_code == 1
    assert "Error: broken: step check failed: the ONNX checker rejected model.onnx:" in result.stderr
    assert "nowhere" in result.stderr
    assert "Traceback" not in result.output
    # the source step succeeded and stays cached
    again = CliRunner().invoke(cli, ["plan", recipe])
    assert "broken:source: cached: up to date" in again.stdout


def test_a_file_that_is_not_onnx_fails_the_source_step(project: Path) -> None:
    recipe = onnx_recipe(project, b"\x00\x01 this is not a protobuf \xff" * 10)
    result = CliRunner().invoke(cli, ["make", recipe])
    assert result.exit_code == 1
    assert "Error: broken: step source failed: source.onnx.path: broken.onnx is not an ONNX model" in result.stderr
    assert "skipped: broken:check" in result.stderr


def test_a_missing_onnx_file_is_named(project: Path) -> None:
    (project / "recipes" / "gone.yaml").write_text(
        "name: gone\nsource:\n  onnx: {path: nothere.onnx}\n", encoding="utf-8"
    )
    result = CliRunner().invoke(cli, ["make", "recipes/gone.yaml"])
    assert result.exit_code == 1
    assert "step source failed: source.onnx.path:" in result.stderr and "nothere.onnx does not exist" in result.stderr


def unloadable_model(case: str) -> bytes:
    """A model the ONNX checker and strict shape inference accept but ONNX Runtime cannot load."""
    from onnx import TensorProto, helper

    if case == "custom-op":
        # Any domain may hold any op as far as the checker knows; ORT has no com.example.
        dtype, node = TensorProto.FLOAT, helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    else:
        # Sqrt is defined for bfloat16, but ORT's CPU provider has no bfloat16 kernel for it.
        dtype, node = TensorProto.BFLOAT16, helper.make_node("Sqrt", ["x"], ["y"])
        opsets = [helper.make_opsetid("", 18)]
    x = helper.make_tensor_value_info("x", dtype, [1, 2])
    y = helper.make_tensor_value_info("y", dtype, [1, 2])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), ir_version=10, opset_imports=opsets)
    return bytes(model.SerializeToString())


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        pytest.param(
            "custom-op", "Fatal error: com.example:Frobnicate(-1) is not a registered function/op", id="custom-op"
        ),
        pytest.param(
            "no-kernel",
            "NOT_IMPLEMENTED : Could not find an implementation for Sqrt(13) node with name ''",
            id="no-kernel",
        ),
    ],
)
def test_a_model_onnx_runtime_cannot_load_fails_the_step_that_loads_it(project: Path, case: str, cause: str) -> None:
    recipe = onnx_recipe(project, unloadable_model(case))
    with open(project / recipe, "a", encoding="utf-8") as f:
        f.write("optimize: {level: basic}\n")  # the first step that opens the model in ONNX Runtime
    result = CliRunner().invoke(cli, ["make", recipe])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    # One short paragraph: the step, what failed, ORT's own reason.
    error = result.stderr[result.stderr.index("Error: ") :]
    assert error.startswith(
        "Error: broken: step optimize failed: ONNX Runtime could not optimize the model at level basic: "
    )
    assert cause in error
    assert len(error.splitlines()) == 1 and len(error) < 400, error
    timings = json.loads((project / "artifacts" / "broken" / "timings.json").read_text(encoding="utf-8"))
    assert {name: s["status"] for name, s in timings["steps"].items()} == {
        "source": "built",
        "check": "built",
        "optimize": "failed",
    }

    again = CliRunner().invoke(cli, ["plan", recipe])
    assert "broken:source: cached: up to date" in again.stdout
    assert "broken:check: cached: up to date" in again.stdout
    assert "broken:optimize: will run: no entry in cache (never built)" in again.stdout  # a failure is not cached
