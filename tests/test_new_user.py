"""What a new user hit first (issue 13): each case failed before its fix.

1. a custom dimension name with a sample (was a KeyError traceback in the loader);
2. a targeted build emptied the artifact folder of every other step's outputs, and `plan`
   called such a folder up to date;
3. a factory that is not a Python file was cached as a source, then a bare AssertionError;
4. the global options were refused after the command name;
5. validation.md buried its verdict under hundreds of rows;
6. sub-millisecond figures printed as "0.0 ms";
7. the web target was skipped after `pip install` alone (no `npm ci`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers_cli import built_once, files_under, run

from onnxbuild._util import format_ms

DATA = Path(__file__).resolve().parent / "data"
STEPS = "steps/steps.yaml"


@pytest.fixture(scope="module")
def steps_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project where the two-input, two-output `steps` model was built once (copy it to change it)."""
    return built_once(tmp_path_factory.mktemp("steps"), DATA / "steps", "steps", STEPS)


@pytest.fixture
def steps_project(steps_built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(steps_built, tmp_path / "p", symlinks=True)
    monkeypatch.chdir(tmp_path / "p")
    monkeypatch.delenv("ONNXBUILD_CACHE_DIR", raising=False)
    return tmp_path / "p"


# ---------------------------------------------------------------- 1. custom dimensions


def test_a_custom_dimension_builds_validates_and_benchmarks(steps_built: Path) -> None:
    folder = steps_built / "artifacts" / "steps"
    validation = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    shapes = [r["shape"] for r in validation["variants"]["model"]["shapes"]]
    # every dynamic axis differs from the export sample (batch 2, steps 4) in one shape
    assert shapes == [{"batch": 1, "steps": 1}, {"batch": 2, "steps": 4}, {"batch": 5, "steps": 9}]
    assert validation["passed"] is True
    for r in validation["variants"]["model"]["shapes"]:
        assert sorted(r["outputs"]) == ["gated", "pooled"]
    bench = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
    assert [r["shape"] for r in bench["results"]] == [{"batch": 2, "steps": 4}]
    assert bench["results"][0]["p50_ms"] > 0


def test_a_benchmark_shape_missing_an_axis_is_a_recipe_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(DATA / "steps", tmp_path / "steps")
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / STEPS
    recipe.write_text(
        recipe.read_text(encoding="utf-8").replace(
            "  iterations: 3\n", "  iterations: 3\n  shapes: [{batch: 1}, {batch: 1, steps: 2, frames: 3}]\n"
        ),
        encoding="utf-8",
    )
    result = run("plan", STEPS)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1:] == [
        "  steps/steps.yaml:14:12: benchmark.shapes[0]: missing a size for dimension 'steps' (the inputs use: "
        "batch, steps)",
        "  steps/steps.yaml:14:45: benchmark.shapes[1].frames: unknown dimension (the inputs use: batch, steps)",
    ]


# ---------------------------------------------------------------- 2. targeted builds


def test_a_targeted_forced_build_keeps_every_current_output(steps_project: Path) -> None:
    folder = steps_project / "artifacts" / "steps"
    before = files_under(folder)
    steps_before = [s["name"] for s in json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["steps"]]
    result = run("make", STEPS, "--target", "check", "--force")
    assert result.exit_code == 0, result.output
    assert files_under(folder) == before
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in manifest["steps"]] == steps_before
    status = {
        name: s["status"]
        for name, s in json.loads((folder / "timings.json").read_text(encoding="utf-8"))["steps"].items()
    }
    # the chain to check reran; validate, report and benchmark (outside it) stayed, as the rebuilt export came out
    # identical
    assert status == {
        "source": "built",
        "export": "built",
        "check": "built",
        "validate": "cached",
        "report": "cached",
        "machine": "cached",
        "benchmark": "cached",
    }
    plan = run("plan", STEPS)
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.splitlines()[-1] == "everything is up to date"


def test_single_forces_only_the_target(steps_project: Path) -> None:
    result = run("make", STEPS, "--target", "benchmark", "--force", "--single")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "steps: ok (6 cached, 1 built)"
    assert [line.split()[:2] for line in lines[1:8]] == [
        ["source", "cached"],
        ["export", "cached"],
        ["check", "cached"],
        ["validate", "cached"],
        ["report", "cached"],
        ["machine", "cached"],
        ["benchmark", "built"],
    ]
    assert "--single" in run("make", "--help").stdout


def test_single_needs_a_target(steps_project: Path) -> None:
    result = run("make", STEPS, "--force", "--single")
    assert result.exit_code == 2
    assert result.stderr == "Error: --single forces just the --target step; name one with --target STEP\n"


def test_plan_names_files_missing_or_altered_in_the_artifact_folder(steps_project: Path) -> None:
    folder = steps_project / "artifacts" / "steps"
    (folder / "reports" / "validation.md").unlink()
    (folder / "benchmark.md").unlink()
    (folder / "benchmark.md").write_text(
        "edited by hand\n", encoding="utf-8"
    )  # a new file: the cache's copy is untouched
    result = run("plan", STEPS)
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-3:] == [
        "artifacts/steps/reports/validation.md: missing; `onnxbuild make steps/steps.yaml` restores it from the cache",
        "artifacts/steps/benchmark.md: differs from what step benchmark built; `onnxbuild make steps/steps.yaml` "
        "restores it from the cache",
        "2 artifact files out of step with the cache",
    ]
    as_json = json.loads(run("plan", STEPS, "--json").stdout)
    assert as_json["up_to_date"] is False and len(as_json["artifacts_out_of_step"]) == 2
    assert run("make", STEPS).exit_code == 0
    assert run("plan", STEPS).exit_code == 0


def test_a_target_leaves_out_steps_that_are_not_current(steps_project: Path) -> None:
    """A step beyond the target whose recipe section changed is not this build's business:
    it is left out of the manifest (its stale outputs removed) and `plan` says it would run."""
    recipe = steps_project / STEPS
    recipe.write_text(recipe.read_text(encoding="utf-8").replace("iterations: 3", "iterations: 4"), encoding="utf-8")
    result = run("make", STEPS, "--target", "check")
    assert result.exit_code == 0, result.output
    folder = steps_project / "artifacts" / "steps"
    names = [s["name"] for s in json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["steps"]]
    assert names == [
        "source",
        "export",
        "check",
        "validate",
        "report",
        "machine",
    ]  # current steps beyond the target stay
    assert "benchmark.json" not in files_under(folder) and "reports/validation.json" in files_under(folder)
    plan = run("plan", STEPS)
    assert plan.exit_code == 1
    assert "steps:benchmark: will run: benchmark.iterations changed 3 -> 4" in plan.stdout


# ---------------------------------------------------------------- 3. factory references


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            "../../etc/passwd:build",
            '../../etc/passwd is not a Python file; name a .py file, e.g. "model.py:build" (relative to the '
            'recipe\'s folder) or "package.module:build"',
        ),
        (
            "/etc/model.py:build",
            '/etc/model.py is an absolute path; name a .py file, e.g. "model.py:build" (relative to the recipe\'s '
            'folder) or "package.module:build"',
        ),
        (
            "../../elsewhere/model.py:build",
            "../../elsewhere/model.py lies outside the recipe's folder and the folder above it; keep model code "
            "beside the recipe",
        ),
        (
            "sub/../../../model.py:build",
            "sub/../../../model.py lies outside the recipe's folder and the folder above it; keep model code "
            "beside the recipe",
        ),
    ],
)
def test_a_factory_that_is_not_a_python_file_beside_the_recipe_is_a_recipe_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(
        f'name: r\nsource:\n  pytorch: {{factory: "{factory}"}}\nexport:\n  inputs: [{{name: x, shape: [batch, 4]}}]\n',
        encoding="utf-8",
    )
    result = run("make", "r.yaml")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1] == f"  r.yaml:3:22: source.pytorch.factory: {message}"
    assert not (tmp_path / "artifacts").exists() and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("body", "factory", "message"),
    [
        (
            "def other():\n    pass\n",
            "m.py:build",
            "source.pytorch.factory: m.py defines no function 'build' at its top level; add `def build(...)` "
            "there or fix the name after the colon",
        ),
        ("def build(:\n", "m.py:build", "source.pytorch.factory: m.py is not valid Python (line 1: invalid syntax)"),
        (
            None,
            "gone.py:build",
            "source.pytorch.factory: {dir}/gone.py does not exist (paths are relative to the recipe's folder, {dir})",
        ),
    ],
)
def test_the_source_step_checks_the_factory_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str | None, factory: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    if body is not None:
        (tmp_path / "m.py").write_text(body, encoding="utf-8")
    (tmp_path / "r.yaml").write_text(
        f'name: r\nsource:\n  pytorch: {{factory: "{factory}"}}\nexport:\n  inputs: [{{name: x, shape: [batch, 4]}}]\n',
        encoding="utf-8",
    )
    result = run("make", "r.yaml")
    assert result.exit_code == 1
    assert "Error: r: step source failed: " + message.format(dir=tmp_path) in result.stderr.splitlines()
    assert "Traceback" not in result.output and "AssertionError" not in result.output


# ---------------------------------------------------------------- 4. options after the command


def test_global_options_are_accepted_after_the_command(steps_project: Path, tmp_path: Path) -> None:
    cache, artifacts = tmp_path / "elsewhere-cache", tmp_path / "elsewhere-artifacts"
    result = run("make", "--cache-dir", str(cache), "--artifacts-dir", str(artifacts), STEPS, "--target", "check")
    assert result.exit_code == 0, result.output
    assert (artifacts / "steps" / "model.onnx").is_file() and (cache / "entries").is_dir()
    plan = run("plan", STEPS, "--target", "check", "--cache-dir", str(cache), "--artifacts-dir", str(artifacts))
    assert plan.exit_code == 0, plan.output
    # after the command wins over before it
    before = run(
        "--cache-dir",
        str(tmp_path / "nowhere"),
        "plan",
        STEPS,
        "--target",
        "check",
        "--cache-dir",
        str(cache),
        "--artifacts-dir",
        str(artifacts),
    )
    assert before.exit_code == 0, before.output
    for command in ("make", "plan", "diff", "verify", "clean", "gc"):
        assert "--cache-url" in run(command, "--help").stdout


# ---------------------------------------------------------------- 5. validation.md


def _case(shape: dict[str, int], outputs: dict[str, float], failed: str = "") -> dict[str, Any]:
    return {
        "shape": shape,
        "error": None,
        "passed": not failed,
        "top1_agreement": 1.0,
        "outputs": {
            n: {
                "max_abs_diff": d,
                "max_rel_diff": d,
                "mismatch_fraction": 0.5 if n == failed else 0.0,
                "passed": n != failed,
            }
            for n, d in outputs.items()
        },
    }


def test_validation_markdown_leads_with_one_verdict_table_and_folds_the_details() -> None:
    from onnxbuild.report.validation import markdown

    outputs = {f"present.{i}.key": 1e-7 * (i + 1) for i in range(12)} | {"logits": 2e-7}
    variant = {
        "provider": "CPUExecutionProvider",
        "atol": 1e-4,
        "rtol": 1e-3,
        "top1": None,
        "accuracy": None,
        "embedding_cosine": None,
        "web": None,
    }
    report = {
        "passed": False,
        "variants": {
            "int8": {**variant, "shapes": [_case({"batch": 1, "sequence": 8}, outputs, failed="present.10.key")]},
            "model": {
                **variant,
                "shapes": [_case({"batch": 1, "sequence": 8}, outputs), _case({"batch": 3, "sequence": 64}, outputs)],
            },
        },
    }
    text = markdown(report, "gpt2")
    lines = text.splitlines()
    table = lines.index("| variant | shape | worst output | max abs diff | tolerance | top-1 agreement | result |")
    assert lines[table - 2] == "Overall: **FAILED**"
    assert lines[table + 2 : table + 5] == [
        "| model | batch=1, sequence=8 | present.11.key | 1.20e-06 | atol 0.0001, rtol 0.001 | 1.000 | pass |",
        "| model | batch=3, sequence=64 | present.11.key | 1.20e-06 | atol 0.0001, rtol 0.001 | 1.000 | pass |",
        "| int8 | batch=1, sequence=8 | present.10.key | 1.10e-06 | atol 0.0001, rtol 0.001 | 1.000 | **FAIL** |",
    ]
    assert text.index("## Details") > table and text.count("<details>") == 2
    detail = [line.split(" | ")[1] for line in lines if line.startswith("| batch=1, sequence=8 | present.")][:12]
    assert detail == [f"present.{i}.key" for i in range(12)]  # present.2 before present.10


# ---------------------------------------------------------------- 6. sub-millisecond figures


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0.0004, "0.40 µs"),
        (0.0123, "12.3 µs"),
        (0.34, "340 µs"),
        (0.999, "999 µs"),
        (1.0, "1.00 ms"),
        (12.345, "12.35 ms"),
        (126.4, "126 ms"),
        (None, "-"),
    ],
)
def test_latencies_below_a_millisecond_are_shown_in_microseconds(ms: float | None, shown: str) -> None:
    assert format_ms(ms) == shown


def test_the_benchmark_summary_and_markdown_never_say_0_0_ms(steps_built: Path) -> None:
    folder = steps_built / "artifacts" / "steps"
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    summary = next(s["data"]["summary"] for s in manifest["steps"] if s["name"] == "benchmark")
    bench = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
    p50 = bench["results"][0]["p50_ms"]
    assert f"p50 {format_ms(p50)}" in summary and "0.0 ms" not in summary
    table = (folder / "benchmark.md").read_text(encoding="utf-8")
    assert f"| {format_ms(p50)} |" in table and "| 0.00 |" not in table


# ---------------------------------------------------------------- 7. the web target after pip install alone


def test_the_web_target_installs_onnxruntime_web_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package installed by pip has package.json, the lock and run.mjs but no node_modules:
    the first use installs the pinned package into the per-user folder and runs there."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from onnxbuild import web

    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js with npm is not installed: the web target is skipped there, with that reason")
    bare = tmp_path / "site-packages-web"
    bare.mkdir()
    for name in ("package.json", "package-lock.json", "run.mjs"):
        shutil.copyfile(web.HERE / name, bare / name)
    monkeypatch.setattr(web, "HERE", bare)
    monkeypatch.setattr(web, "LOCK", bare / "package-lock.json")
    monkeypatch.setenv(web.WEB_DIR_ENV, str(tmp_path / "user-cache" / "web"))
    assert web.home() is None
    assert (
        web.unavailable(install=False)
        == f"onnxruntime-web is not installed: run `npm ci --prefix {bare}` (make install does)"
    )
    assert web.unavailable() is None  # installs
    assert web.home() == tmp_path / "user-cache" / "web" and web.where() == str(tmp_path / "user-cache" / "web")
    assert (
        web.version()
        == json.loads((bare / "package.json").read_text(encoding="utf-8"))["dependencies"]["onnxruntime-web"]
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = tmp_path / "add.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(model))
    got = web.run(model, {"x": np.array([1.5, -2.0], dtype=np.float32)})
    assert got.error is None
    assert got.outputs["y"].tolist() == [3.0, -4.0]
    assert not [
        p for p in (tmp_path / "user-cache").iterdir() if p.name.startswith(".web.") and p.is_dir()
    ]  # no half-installed temp folder


def test_without_npm_the_first_use_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxbuild import web

    monkeypatch.setattr(web, "HERE", tmp_path)
    monkeypatch.setenv(web.WEB_DIR_ENV, str(tmp_path / "user"))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/node" if name == "node" else None)
    assert (
        web.unavailable()
        == "onnxruntime-web is not installed and npm is not on PATH: install Node.js with npm, or run "
        f"`npm ci --prefix {tmp_path}`"
    )


def test_benchmark_figures_are_keyed_by_the_machine(steps_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner of another CPU kind does not take latencies measured elsewhere as its own (#15)."""
    from onnxbuild import environment as versions

    assert run("plan", STEPS).exit_code == 0
    real = versions.cpu_info()
    monkeypatch.setattr(versions, "cpu_info", lambda: ("Another CPU 9000", real[1]))
    plan = run("plan", STEPS)
    assert plan.exit_code == 1
    assert f'steps:machine: will run: machine.cpu changed "{real[0]}" -> "Another CPU 9000"' in plan.stdout
    assert f'steps:benchmark: will run: machine.cpu changed "{real[0]}" -> "Another CPU 9000"' in plan.stdout
    assert [line.split(":")[1] for line in plan.stdout.splitlines() if ": will run:" in line] == [
        "machine",
        "benchmark",
    ]
