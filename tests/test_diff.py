"""onnxbuild diff in a real git repository: resolved-key changes, invalidated steps, figure deltas."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from onnxbuild.cli import cli

LR = "recipes/linear-regression.yaml"


@pytest.fixture
def repo(project: Path) -> Path:
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run(["git", "add", "recipes"], cwd=project, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "recipes"], cwd=project, check=True)
    return project


def edit(repo: Path, path: str, old: str, new: str) -> None:
    file = repo / path
    file.write_text(file.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")


def test_diff_shows_the_change_and_the_rebuilt_steps_in_md_and_json(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["make", LR]).exit_code == 0
    edit(repo, LR, "values: [0.5, -0.5]", "values: [0.5, -0.25]")
    nothing_built = runner.invoke(cli, ["diff", "--format", "md"])
    assert nothing_built.exit_code == 0, nothing_built.output
    assert "### `recipes/linear-regression.yaml`: changed" in nothing_built.stdout
    assert "| `source.graph.initializers[1].values[1]` | -0.5 | -0.25 |" in nothing_built.stdout
    assert "Steps that rebuild: source, check" in nothing_built.stdout

    assert runner.invoke(cli, ["make", LR]).exit_code == 0
    summary = repo / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    after = runner.invoke(cli, ["diff", "--format", "json"])
    data = json.loads(after.stdout)
    (recipe,) = data["recipes"]
    assert recipe["changes"] == [
        {"key": "source.graph.initializers[1].values[1]", "change": "changed", "base": -0.5, "now": -0.25}
    ]
    assert recipe["invalidated"] == ["source", "check"]
    assert not summary.exists()  # only Markdown goes to the step summary
    md = runner.invoke(cli, ["diff", "--format", "md"])
    assert summary.read_text(encoding="utf-8") == md.stdout


def test_a_changed_default_shows_and_added_recipes_are_listed(repo: Path) -> None:
    edit(repo, "recipes/tiny-gpt2.yaml", "  opset: 18\n", "  opset: 17\n  exporter: torchscript\n")
    (repo / "recipes" / "new.yaml").write_text(
        (repo / LR).read_text(encoding="utf-8").replace("name: linear-regression", "name: new"), encoding="utf-8"
    )
    result = CliRunner().invoke(cli, ["diff"])
    assert result.exit_code == 0, result.output
    assert "recipes/new.yaml: added" in result.stdout
    assert "  export.opset: 18 -> 17" in result.stdout
    # exporter: torchscript is the default, so writing it out changes nothing
    assert "export.exporter" not in result.stdout
    assert "rebuilds: export, check, validate, report" in result.stdout


def test_diff_as_html_is_one_self_contained_page(repo: Path) -> None:
    edit(repo, LR, "values: [0.5, -0.5]", "values: [0.5, -0.25]")
    result = CliRunner().invoke(cli, ["diff", "--format", "html"])
    assert result.exit_code == 0, result.output
    page = result.stdout
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "<link" not in page and "<script" not in page
    assert "<code>recipes/linear-regression.yaml</code>: <b>changed</b>" in page
    assert "<td><code>source.graph.initializers[1].values[1]</code></td><td>-0.5</td><td>-0.25</td>" in page
    assert "Steps that rebuild: source, check" in page


@pytest.mark.parametrize(
    ("args", "arrange", "message"),
    [
        (["recipes/nope.yaml"], None, "Error: recipes/nope.yaml: no such recipe here or at "),
        (
            ["--base", "0123456789abcdef0123456789abcdef01234567"],
            None,
            "Error: the base '0123456789abcdef0123456789abcdef01234567' is not a commit here (a shallow clone? "
            "fetch it: git fetch --depth=50 origin 0123456789abcdef0123456789abcdef01234567)",
        ),
        (
            [LR],
            lambda repo: (repo / LR).write_text("name: [broken\n", encoding="utf-8"),
            "Error: 1 recipe cannot be loaded: recipes/linear-regression.yaml (see above)",
        ),
    ],
    ids=["missing-path", "base-not-here", "invalid-recipe"],
)
def test_diff_errors_exit_non_zero_with_a_clear_message(
    repo: Path, args: list[str], arrange: Any, message: str
) -> None:
    if arrange:
        arrange(repo)
    result = CliRunner().invoke(cli, ["diff", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message), result.stderr
    assert "Traceback" not in result.output


def test_diff_of_a_recipe_outside_the_repository(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "r.yaml"
    outside.write_text((repo / LR).read_text(encoding="utf-8"), encoding="utf-8")
    result = CliRunner().invoke(cli, ["diff", str(outside)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {outside} is outside the git repository at ")


def test_a_step_summary_in_a_missing_folder_is_a_clear_error(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edit(repo, LR, "values: [0.5, -0.5]", "values: [0.5, -0.25]")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(repo / "no" / "such" / "summary.md"))
    result = CliRunner().invoke(cli, ["diff", "--format", "md"])
    assert result.exit_code == 2
    assert "cannot append to $GITHUB_STEP_SUMMARY" in result.stderr and "Traceback" not in result.output


def test_a_factory_edit_is_in_the_diff_with_the_steps_it_rebuilds(repo: Path) -> None:
    factory = repo / "recipes" / "digits_mlp.py"
    factory.write_text(
        factory.read_text(encoding="utf-8") + "\n# a comment that still changes the file's digest\n", encoding="utf-8"
    )
    result = CliRunner().invoke(cli, ["diff", "--format", "json"])
    assert result.exit_code == 0, result.output
    (recipe,) = json.loads(result.stdout)["recipes"]  # found through the file it reads, not its YAML
    assert recipe["path"] == "recipes/digits-mlp.yaml" and recipe["status"] == "changed"
    (change,) = recipe["changes"]
    assert change["key"] == "source.pytorch.factory (recipes/digits_mlp.py)"
    assert (
        change["base"].startswith("sha256 ") and change["now"].startswith("sha256 ") and change["base"] != change["now"]
    )
    assert recipe["invalidated"][:2] == ["source", "export"]


def test_a_package_bump_against_the_base_lock_is_in_the_diff(repo: Path) -> None:
    from onnxbuild.environment import package_version

    assert CliRunner().invoke(cli, ["make", LR, "--lock"]).exit_code == 0
    lock = repo / "recipes" / "linear-regression.lock.json"
    data = json.loads(lock.read_text(encoding="utf-8"))
    data["steps"]["source"]["ingredients"]["packages"]["onnx"] = "1.0.0"  # the base was locked with an older onnx
    lock.write_text(json.dumps(data), encoding="utf-8")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "add", "recipes"], cwd=repo, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "lock"], cwd=repo, check=True)
    result = CliRunner().invoke(cli, ["diff", LR, "--base", "HEAD", "--format", "md"])
    assert result.exit_code == 0, result.output
    assert f'| `package onnx` | "1.0.0" | "{package_version("onnx")}" |' in result.stdout
    assert "Steps that rebuild: source, check" in result.stdout


def test_figures_say_not_built_or_unchanged_and_a_pipe_cannot_break_the_table(repo: Path) -> None:
    edit(repo, LR, "description: ", "description: a | b, ")
    not_built = CliRunner().invoke(cli, ["diff", LR, "--format", "md"])
    assert "Figures: not built on one side (build both, or share a remote cache)." in not_built.stdout
    row = next(line for line in not_built.stdout.splitlines() if line.startswith("| `description`"))
    assert row.count(" | ") == 2 and "a \\| b" in row
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    assert CliRunner().invoke(cli, ["make", LR]).exit_code == 0
    subprocess.run(["git", "stash", "-q"], cwd=repo, check=True)
    assert CliRunner().invoke(cli, ["make", LR]).exit_code == 0
    subprocess.run(["git", *env, "stash", "pop", "-q"], cwd=repo, check=True)
    built = CliRunner().invoke(cli, ["diff", LR, "--format", "json"])
    assert json.loads(built.stdout)["recipes"][0]["figures"] == "unchanged"


def test_a_rename_is_one_entry_and_a_new_variant_is_its_own_lines(repo: Path) -> None:
    subprocess.run(["git", "mv", "recipes/tiny-gpt2.yaml", "recipes/tiny-lm.yaml"], cwd=repo, check=True)
    recipe = repo / "recipes" / "tiny-lm.yaml"
    recipe.write_text(
        recipe.read_text(encoding="utf-8") + "quantize:\n  - {name: int8, method: dynamic}\n", encoding="utf-8"
    )
    result = CliRunner().invoke(cli, ["diff", "--format", "json"])
    assert result.exit_code == 0, result.output
    recipes = json.loads(result.stdout)["recipes"]
    assert [(r["path"], r["status"]) for r in recipes] == [
        ("recipes/tiny-lm.yaml", "renamed from recipes/tiny-gpt2.yaml")
    ]
    keys = {c["key"]: c for c in recipes[0]["changes"]}
    assert keys["quantize[int8].method"] == {
        "key": "quantize[int8].method",
        "change": "added",
        "base": None,
        "now": "dynamic",
    }
    assert keys["quantize[int8].name"]["now"] == "int8" and all(len(json.dumps(c)) < 200 for c in recipes[0]["changes"])
    assert "quantize.int8" in recipes[0]["invalidated"]


def test_figures_are_numbers_in_json_and_formatted_for_people(project: Path) -> None:
    import shutil

    shutil.copytree(Path(__file__).parent / "data" / "steps", project / "recipes" / "steps")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run(["git", "add", "recipes"], cwd=project, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "recipes"], cwd=project, check=True)
    runner = CliRunner()
    assert runner.invoke(cli, ["make", "recipes/steps/steps.yaml"]).exit_code == 0
    edit(project, "recipes/steps/steps.yaml", "iterations: 3", "iterations: 4")
    assert runner.invoke(cli, ["make", "recipes/steps/steps.yaml"]).exit_code == 0
    data = json.loads(runner.invoke(cli, ["diff", "recipes/steps/steps.yaml", "--format", "json"]).stdout)
    (metric,) = [m for m in data["recipes"][0]["metrics"] if m["what"].startswith("p50 model on CPU")]
    assert metric["unit"] == "ms" and isinstance(metric["base"], float) and isinstance(metric["now"], float)
    text = runner.invoke(cli, ["diff", "recipes/steps/steps.yaml"]).stdout
    line = next(line for line in text.splitlines() if "p50 model on CPU (batch=2, steps=4)" in line)
    assert " -> " in line and line.rstrip().endswith("x)") and ("µs" in line or " ms" in line)
