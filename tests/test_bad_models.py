"""Bad models: each failure names the step and the cause in one paragraph, exits 1, keeps what was built."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from onnxbuild.cli import cli


def onnx_recipe(project: Path, model_bytes: bytes) -> str:
    (project / "recipes" / "broken.onnx").write_bytes(model_bytes)
    (project / "recipes" / "broken.yaml").write_text("name: broken\nsource:\n  onnx: {path: broken.onnx}\n", encoding="utf-8")
    return "recipes/broken.yaml"


def invalid_model() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    node = helper.make_node("Add", ["x", "nowhere"], ["y"])  # "nowhere" is never defined
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
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
    (project / "recipes" / "gone.yaml").write_text("name: gone\nsource:\n  onnx: {path: nothere.onnx}\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["make", "recipes/gone.yaml"])
    assert result.exit_code == 1
    assert "step source failed: source.onnx.path:" in result.stderr and "nothere.onnx does not exist" in result.stderr
