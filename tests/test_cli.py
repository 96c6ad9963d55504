"""The ``onnxbuild`` command, through click's CliRunner, in a throwaway project folder.

Builds use recipes/linear-regression.yaml (a 2-node graph: about a second per build).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers_cli import built_once, files_under, run

from onnxbuild.cli import cli

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
LR = "recipes/linear-regression.yaml"
LR_FILES = {"manifest.json", "model.onnx", "reports/check.json", "reports/check.md", "timings.json", "report.html"}

BAD_RECIPE = """\
name: bad/name
source:
  graph:
    opset: eighteen
    inputs: []
"""
BAD_PROBLEMS = [
    "recipes/bad.yaml:1:7: name: must be a name of letters, digits, '.', '_' or '-' (at most 64, no path "
    'separators), e.g. gpt2-small (got "bad/name")',
    "recipes/bad.yaml:3:3: source.graph: missing required key 'outputs' (a list)",
    "recipes/bad.yaml:3:3: source.graph: missing required key 'nodes' (a list)",
    'recipes/bad.yaml:4:12: source.graph.opset: must be an integer from 7 to 23 (got "eighteen")',
    "recipes/bad.yaml:5:13: source.graph.inputs: must have at least 1 item",
]


@pytest.fixture(scope="module")
def first_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder in which linear-regression was built once (shared: copy, don't change)."""
    return built_once(tmp_path_factory.mktemp("first-build"), RECIPES, "recipes", LR)


@pytest.fixture
def built(project: Path, first_build: Path) -> Path:
    """The project after one successful build of linear-regression: its artifacts and cache.

    Copied rather than rebuilt, to keep the tests fast; a copied cache must work as well
    as the original, so this also checks that nothing in it depends on where it lives.
    """
    for name in ("artifacts", ".onnxbuild"):
        shutil.copytree(first_build / name, project / name, symlinks=True)
    return project


# ---------------------------------------------------------------- help, schema, show, dag


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_help_of_every_command_shows_an_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.output
    assert f"onnxbuild {command}" in result.output


def test_top_level_help_says_where_to_start() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "onnxbuild make recipes/gpt2.yaml" in result.output
    for command in cli.commands:
        assert command in result.output


def test_schema_is_draft_2020_12_json() -> None:
    from jsonschema import Draft202012Validator

    result = run("schema")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(data)
    assert data["additionalProperties"] is False
    assert data["required"] == ["name", "source"]


def test_show_prints_the_recipe_with_defaults(project: Path) -> None:
    import yaml

    result = run("show", LR)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"# {LR}, resolved (every default filled in)\n")
    shown = yaml.safe_load(result.stdout)
    graph = shown["source"]["graph"]
    assert (graph["name"], graph["doc_string"], graph["extra_opsets"]) == ("graph", "", {})
    assert graph["initializers"][0]["random"] == {"seed": 0, "distribution": "normal", "scale": 1.0}
    assert shown["providers"] == [{"name": "CPUExecutionProvider", "options": {}}]
    assert (shown["optimize"], shown["quantize"], shown["benchmark"]) == (None, [], None)
    assert run("show", LR).stdout == result.stdout
    assert not (project / ".onnxbuild").exists()


def test_dag_text(project: Path) -> None:
    result = run("dag", LR)
    assert result.exit_code == 0
    assert result.stdout == textwrap.dedent(
        f"""\
        linear-regression ({LR})
          source     writes model.onnx
          check      writes reports/check.json, reports/check.md  <- source
        """
    )


def test_dag_text_of_a_torch_recipe(project: Path) -> None:
    result = run("dag", "recipes/tiny-gpt2.yaml")
    assert result.exit_code == 0
    assert result.stdout == textwrap.dedent(
        """\
        tiny-gpt2 (recipes/tiny-gpt2.yaml)
          source     writes reports/source.json
          export     writes model.onnx, config.json  <- source
          check      writes reports/check.json, reports/check.md  <- export
          validate   writes reports/validation/model.json, reports/validation/model.md  <- source, export
          report     writes reports/validation.json, reports/validation.md  <- validate
        """
    )


def test_dag_mermaid(project: Path) -> None:
    result = run("dag", LR, "--format", "mermaid")
    assert result.exit_code == 0
    assert result.stdout == textwrap.dedent(
        """\
        flowchart TD
            source["source (source)"]
            check["check (check)"]
            source --> check
        """
    )


def test_dag_dot(project: Path) -> None:
    result = run("dag", LR, "--format", "dot")
    assert result.exit_code == 0
    assert result.stdout == textwrap.dedent(
        """\
        digraph "linear-regression" {
            rankdir=LR;
            "source" [label="source\\nmodel.onnx"];
            "check" [label="check\\nreports/check.json, reports/check.md"];
            "source" -> "check";
        }
        """
    )


def test_dag_unknown_format(project: Path) -> None:
    result = run("dag", LR, "--format", "png")
    assert result.exit_code == 2
    assert "Invalid value for '--format'" in result.stderr


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args",
    [("make",), ("plan",), ("show",), ("dag",), ("clean",), ("make", "--target", "check")],
    ids=lambda a: " ".join(a),
)
def test_bad_recipe_exits_2_and_writes_nothing(project: Path, args: tuple[str, ...]) -> None:
    (project / "recipes" / "bad.yaml").write_text(BAD_RECIPE, encoding="utf-8")
    result = run(*args, "recipes/bad.yaml")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"Error: {len(BAD_PROBLEMS)} problems in the recipe:"] + [
        f"  {p}" for p in BAD_PROBLEMS
    ]
    assert "Traceback" not in result.output
    assert not (project / "artifacts").exists()
    assert not (project / ".onnxbuild").exists()


def test_a_good_recipe_beside_a_bad_one_writes_nothing(project: Path) -> None:
    (project / "recipes" / "bad.yaml").write_text(BAD_RECIPE, encoding="utf-8")
    result = run("make", LR, "recipes/bad.yaml")
    assert result.exit_code == 2
    assert not (project / "artifacts").exists()
    assert not (project / ".onnxbuild").exists()


def test_problems_of_several_recipes_are_reported_together(project: Path) -> None:
    (project / "recipes" / "bad.yaml").write_text(BAD_RECIPE, encoding="utf-8")
    (project / "recipes" / "empty.yaml").write_text("", encoding="utf-8")
    result = run("plan", "recipes/bad.yaml", "recipes/empty.yaml", "recipes/missing.yaml")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"Error: {len(BAD_PROBLEMS) + 2} problems in the recipe:"
    assert result.stderr.splitlines()[-2:] == [
        "  recipes/empty.yaml:1:1: the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for "
        "examples)",
        "  recipes/missing.yaml: no such file (check the path; recipes usually live in recipes/)",
    ]


def test_one_problem_is_singular(project: Path) -> None:
    result = run("show", "recipes/nope.yaml")
    assert result.exit_code == 2
    assert (
        result.stderr
        == "Error: 1 problem in the recipe:\n  recipes/nope.yaml: no such file (check the path; recipes usually "
        "live in recipes/)\n"
    )


def test_make_needs_a_recipe(project: Path) -> None:
    result = run("make")
    assert result.exit_code == 2
    assert "Missing argument 'RECIPES...'" in result.stderr
    assert not (project / ".onnxbuild").exists()


# ---------------------------------------------------------------- make, plan, clean, gc


def test_make_builds_the_artifacts(project: Path) -> None:
    result = run("make", LR)
    assert result.exit_code == 0, result.output
    assert files_under(project / "artifacts" / "linear-regression") == LR_FILES
    assert result.stdout.splitlines()[0] == "linear-regression: ok (2 built)"
    assert "  artifacts: artifacts/linear-regression/" in result.stdout.splitlines()
    manifest = json.loads((project / "artifacts" / "linear-regression" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["steps"]] == ["source", "check"]
    check = json.loads((project / "artifacts" / "linear-regression" / "reports" / "check.json").read_text())
    assert (check["nodes"], check["op_types"], check["opsets"]) == (2, {"Add": 1, "MatMul": 1}, {"": 18})


def test_second_make_is_all_cached(built: Path) -> None:
    result = run("make", LR)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "linear-regression: ok (2 cached)"
    assert re.fullmatch(r"  source\s+cached\s+model\.onnx", lines[1])
    assert re.fullmatch(r"  check\s+cached\s+reports/check\.json, reports/check\.md", lines[2])
    assert "  cached linear-regression:source" in result.stderr
    assert "  run " not in result.stderr


def test_plan_before_the_first_build(project: Path) -> None:
    result = run("plan", LR)
    assert result.exit_code == 1
    assert result.stdout == (
        "linear-regression:source: will run: no entry in cache (never built)\n"
        "linear-regression:check: will run: no entry in cache (never built)\n"
        "2 steps would run, 0 cached, never built here: no estimate\n"
    )
    assert not (project / "artifacts").exists()


def test_plan_when_up_to_date(built: Path) -> None:
    result = run("plan", LR)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "linear-regression:source: cached: up to date\n"
        "linear-regression:check: cached: up to date\n"
        "everything is up to date\n"
    )


def test_plan_names_the_key_that_changed(built: Path) -> None:
    recipe = built / LR
    text = recipe.read_text(encoding="utf-8")
    assert "random: {seed: 0, distribution: normal}" in text
    recipe.write_text(text.replace("random: {seed: 0,", "random: {seed: 1,"), encoding="utf-8")
    result = run("plan", LR)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        "linear-regression:source: will run: source.graph.initializers[0].random.seed changed 0 -> 1",
        "linear-regression:check: will run: only if its input from source changes",
    ]
    # a measured figure: its words are fixed, its number is this machine's
    assert re.fullmatch(
        r"2 steps would run, 0 cached, (under a second|about \d+ s) by the last build's timings", lines[2]
    ), lines[2]
    assert json.loads(run("plan", LR, "--json").stdout)["estimate_s"] < 60


def test_a_no_op_build_keeps_what_each_step_cost(built: Path) -> None:
    """timings.json of a no-op run still says what building each step cost (to estimate a PR's cost)."""
    first = json.loads((built / "artifacts" / "linear-regression" / "timings.json").read_text(encoding="utf-8"))
    assert run("make", LR).exit_code == 0
    again = json.loads((built / "artifacts" / "linear-regression" / "timings.json").read_text(encoding="utf-8"))
    for name, step in again["steps"].items():
        assert step["status"] == "cached" and step["seconds"] == 0
        assert step["build_seconds"] == first["steps"][name]["build_seconds"] > 0


def test_plan_json(built: Path) -> None:
    result = run("plan", LR, "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["up_to_date"] is True
    assert [(s["step"], s["action"], s["reasons"]) for s in data["steps"]] == [
        ("source", "cached", ["up to date"]),
        ("check", "cached", ["up to date"]),
    ]
    assert all(re.fullmatch(r"[0-9a-f]{64}", s["key"]) for s in data["steps"])


def test_plan_force(built: Path) -> None:
    result = run("plan", LR, "--force")
    assert result.exit_code == 1
    assert "linear-regression:source: will run: forced (--force)" in result.stdout.splitlines()


def test_clean_then_gc(built: Path) -> None:
    result = run("clean", LR)
    assert result.exit_code == 0
    assert result.stdout == "removed artifacts/linear-regression/\n"
    assert not (built / "artifacts" / "linear-regression").exists()

    result = run("gc")
    assert result.exit_code == 0
    assert re.fullmatch(r"removed [1-9][0-9]* cache files, freed [0-9.]+ (B|KB|MB)\n", result.stdout), result.stdout
    assert "freed 0 B" not in result.stdout

    result = run("gc")
    assert result.stdout == "removed 0 cache files, freed 0 B\n"
    assert run("clean").stdout == "nothing to remove\n"


def test_gc_keeps_what_artifacts_use(built: Path) -> None:
    assert run("gc").stdout == "removed 0 cache files, freed 0 B\n"
    result = run("make", LR)
    assert result.stdout.splitlines()[0] == "linear-regression: ok (2 cached)"


def test_clean_keeps_the_cache(built: Path) -> None:
    assert run("clean").exit_code == 0
    result = run("make", LR)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "linear-regression: ok (2 cached)"
    assert files_under(built / "artifacts" / "linear-regression") == LR_FILES


def test_target_builds_only_what_it_needs(project: Path) -> None:
    result = run("make", LR, "--target", "source")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "linear-regression: ok (1 built)"
    assert "model.onnx" in files_under(project / "artifacts" / "linear-regression")
    assert "reports/check.json" not in files_under(project / "artifacts" / "linear-regression")
    plan = run("plan", LR)
    assert plan.stdout.splitlines()[:2] == [
        "linear-regression:source: cached: up to date",
        "linear-regression:check: will run: no entry in cache (never built)",
    ]


def test_unknown_target(project: Path) -> None:
    result = run("make", LR, "--target", "nosuchstep")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {LR}: no step named 'nosuchstep' (this recipe's steps: source, check)\n"
    assert "Traceback" not in result.output
    assert not (project / "artifacts").exists()


def test_make_json(project: Path) -> None:
    result = run("make", LR, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True
    (recipe,) = data["recipes"]
    assert (recipe["name"], recipe["recipe"], recipe["artifacts"], recipe["ok"]) == (
        "linear-regression",
        LR,
        "artifacts/linear-regression",
        True,
    )
    assert [(s["name"], s["status"]) for s in recipe["steps"]] == [("source", "built"), ("check", "built")]
    assert [o["path"] for o in recipe["steps"][0]["outputs"]] == ["model.onnx"]


def test_version() -> None:
    from onnxbuild import __version__

    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"onnxbuild, version {__version__}\n"


# ---------------------------------------------------------------- nothing heavy on a no-op


HEAVY = ("torch", "onnx", "onnxruntime", "transformers")

CHECK_IMPORTS = """\
import json, sys
from onnxbuild.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="onnxbuild")
except SystemExit as exc:
    code = exc.code
forbidden = %r
print(json.dumps({"exit": code, "modules": sorted(m for m in sys.modules if m in forbidden or m.split(".")[0] in forbidden)}))
"""  # noqa: E501


@pytest.mark.parametrize(
    ("args", "forbidden", "says"),
    [
        pytest.param(
            ("make", LR),
            (*HEAVY, "jsonschema", "yaml", "importlib.metadata", "onnxbuild.report.page", "multiprocessing"),
            "linear-regression: ok (2 cached)",
            id="make",
        ),
        pytest.param(
            ("plan", LR), (*HEAVY, "jsonschema", "yaml", "importlib.metadata"), "everything is up to date", id="plan"
        ),
        pytest.param(("show", LR), HEAVY, "name: linear-regression", id="show"),
        pytest.param(("dag", LR), HEAVY, "linear-regression (recipes/linear-regression.yaml)", id="dag"),
    ],
)
def test_no_op_commands_import_nothing_heavy(
    built: Path, args: tuple[str, ...], forbidden: tuple[str, ...], says: str
) -> None:
    """A cached make, a plan and a show start fast: heavy modules stay inside the steps.

    The first build ran in another process; the command under test runs in a fresh
    interpreter, so what it imports is its own doing. make and plan find the recipe in
    the memo, so they need neither YAML nor jsonschema; show and dag parse the YAML.
    Package versions come from the cache's memo, not importlib.metadata (40 ms of a no-op:
    the manifest once read them afresh, and the memo was keyed by the first sys.path
    folder, which differs between `onnxbuild` and `python -c`). multiprocessing (5 ms) is
    for starting steps, and a no-op starts none.
    """
    for _ in range(2):  # the first notes the package versions of this sys.path, as a user's first run would
        done = subprocess.run(
            [sys.executable, "-c", CHECK_IMPORTS % (forbidden,), *args],
            cwd=built,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    # A make that ran a step would import onnx in a child process, unseen here.
    assert says in done.stdout.splitlines(), done.stdout + done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"exit": 0, "modules": []}


def test_detailed_exitcode_is_terraforms_for_plan_plan_check_and_diff(project: Path) -> None:
    """Without the flag: 0 current, 1 would run, 2 recipe or usage error. With it, as
    Terraform's plan -detailed-exitcode: 0 nothing changes, 2 changes, 1 any error."""
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run(["git", "add", "recipes"], cwd=project, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "recipes"], cwd=project, check=True)
    assert run("plan", LR).exit_code == 1
    assert run("plan", LR, "--detailed-exitcode").exit_code == 2
    assert run("plan", "--check", LR, "--detailed-exitcode").exit_code == 2  # no lock yet: a change
    assert run("make", LR, "--lock").exit_code == 0
    assert run("plan", LR).exit_code == 0
    assert run("plan", LR, "--detailed-exitcode").exit_code == 0
    assert run("plan", "--check", LR, "--detailed-exitcode").exit_code == 0
    assert run("diff", "--base", "main", LR, "--detailed-exitcode").exit_code == 0
    (project / LR).write_text(
        (project / LR).read_text(encoding="utf-8").replace("values: [0.5, -0.5]", "values: [0.5, -0.25]"),
        encoding="utf-8",
    )
    assert run("diff", "--base", "main", LR).exit_code == 0
    assert run("diff", "--base", "main", LR, "--detailed-exitcode").exit_code == 2
    stale = run("plan", "--check", LR, "--detailed-exitcode")
    assert stale.exit_code == 2 and "Error: the lock files do not match the recipes" in stale.stderr
    # errors are 1 with the flag, 2 (recipe, usage) without
    (project / "recipes" / "bad.yaml").write_text("name: bad\nsource: {graph: 3}\n", encoding="utf-8")
    for args in (
        ("plan", "recipes/bad.yaml"),
        ("plan", "--check", "recipes/bad.yaml"),
        ("diff", "--base", "main", "recipes/bad.yaml"),
        ("diff", "--base", "nope", LR),
        ("plan", LR, "--no-such-option"),
    ):
        plain, detailed = run(*args), run(*args, "--detailed-exitcode")
        assert (plain.exit_code, detailed.exit_code) == (2, 1), (args, plain.output, detailed.output)
        assert "Error" in detailed.stderr and "Traceback" not in detailed.output
