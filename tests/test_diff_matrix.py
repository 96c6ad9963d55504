"""`onnxbuild diff --base main` on the six kinds of change a reviewer meets, each in text,
md and json, with figures read from a shared file:// remote cache by a runner whose own
cache is empty (the README's CI workflow): an opset change, a new int8 variant, a factory
edit, a package bump (simulated in the base's lock), a rename, a comment-only edit."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from onnxbuild.cli import cli

DATA = Path(__file__).parent / "data" / "steps"
RECIPE = "recipes/steps.yaml"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """main: the steps recipe built, locked and pushed to a file:// remote."""
    root = tmp_path_factory.mktemp("matrix")
    repo = root / "origin"
    (repo / "recipes").mkdir(parents=True)
    for f in ("steps.yaml", "steps_model.py"):
        shutil.copy(DATA / f, repo / "recipes" / f)
    remote = (root / "remote").as_uri()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(repo)
        mp.delenv("ONNXBUILD_CACHE_DIR", raising=False)
        result = CliRunner().invoke(
            cli, ["--cache-url", remote, "--cache-dir", str(root / "main-cache"), "make", RECIPE, "--lock"]
        )
        assert result.exit_code == 0, result.output
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "recipes"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "main"], cwd=repo, check=True)
    yield repo, remote


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def opset(work: Path) -> str:
    _edit(work / RECIPE, "  sample: {batch: 2, steps: 4}\n", "  sample: {batch: 2, steps: 4}\n  opset: 17\n")
    return RECIPE


def int8(work: Path) -> str:
    with (work / RECIPE).open("a", encoding="utf-8") as f:
        f.write("quantize:\n  - {name: int8, method: dynamic}\n")
    return RECIPE


def factory(work: Path) -> str:
    _edit(work / "recipes" / "steps_model.py", "torch.sigmoid(", "torch.tanh(")
    return RECIPE


def package(work: Path) -> str:
    # main's lock says the steps were built with onnx 1.16.0; this environment has another
    lock = work / "recipes" / "steps.lock.json"
    data = json.loads(lock.read_text(encoding="utf-8"))
    for step in data["steps"].values():
        packages = step["ingredients"].get("packages", {})
        if "onnx" in packages:
            packages["onnx"] = "1.16.0"
    lock.write_text(json.dumps(data, indent=2), encoding="utf-8")
    subprocess.run([*GIT, "commit", "-qam", "main built with onnx 1.16.0"], cwd=work, check=True)
    subprocess.run(["git", "branch", "-qf", "main"], cwd=work, check=True)
    return RECIPE


def rename(work: Path) -> str:
    subprocess.run(["git", "mv", RECIPE, "recipes/two-by-two.yaml"], cwd=work, check=True)
    subprocess.run(["git", "mv", "recipes/steps.lock.json", "recipes/two-by-two.lock.json"], cwd=work, check=True)
    return "recipes/two-by-two.yaml"


def comment(work: Path) -> str:
    _edit(work / RECIPE, "benchmark:\n", "# timings are only a guide on shared runners\nbenchmark:\n")
    return RECIPE


def _recipe(result: Result) -> dict[str, object]:
    (entry,) = json.loads(result.stdout)["recipes"]
    assert isinstance(entry, dict)
    return entry


CHECKS: dict[str, Callable[[dict[str, Result]], None]] = {}


def check(
    case: Callable[[Path], str],
) -> Callable[[Callable[[dict[str, Result]], None]], Callable[[dict[str, Result]], None]]:
    def register(fn: Callable[[dict[str, Result]], None]) -> Callable[[dict[str, Result]], None]:
        CHECKS[case.__name__] = fn
        return fn

    return register


@check(opset)
def _opset(out: dict[str, Result]) -> None:
    assert "  export.opset: 18 -> 17" in out["text"].stdout
    assert "| `export.opset` | 18 | 17 |" in out["md"].stdout
    entry = _recipe(out["json"])
    assert {"key": "export.opset", "change": "changed", "base": 18, "now": 17} in entry["changes"]  # type: ignore[operator]
    assert entry["invalidated"][:2] == ["export", "check"]  # type: ignore[index]
    # inside the file: the opset, and outputs that did not move
    (model,) = [m for m in entry["models"] if m["path"] == "model.onnx"]  # type: ignore[attr-defined]
    assert {"what": "opset ai.onnx", "base": 18, "now": 17, "unit": ""} in model["changes"]
    assert model["drift"] == {"gated": 0.0, "pooled": 0.0}
    assert "    model.onnx: opset ai.onnx: 18 -> 17" in out["text"].stdout
    assert "| `model.onnx` | opset ai.onnx | 18 | 17 |" in out["md"].stdout
    assert any(m["what"].startswith("p50 model on CPU") and isinstance(m["now"], float) for m in entry["metrics"])  # type: ignore[attr-defined]


@check(int8)
def _int8(out: dict[str, Result]) -> None:
    entry = _recipe(out["json"])
    keys = {c["key"]: c for c in entry["changes"]}  # type: ignore[attr-defined]
    assert keys["quantize[int8].method"]["now"] == "dynamic" and keys["quantize[int8].per_channel"]["now"] is True
    assert "quantize[int8].block_size" not in keys  # an int4 setting a dynamic variant never reads
    assert "quantize.int8" in entry["invalidated"] and "export" not in entry["invalidated"]  # type: ignore[operator]
    assert any(
        m["what"] == "validation int8 max abs diff (new variant)" and isinstance(m["now"], float)
        for m in entry["metrics"]
    )  # type: ignore[attr-defined]
    assert '| `quantize[int8].method` | (absent) | "dynamic" |' in out["md"].stdout
    assert '  quantize[int8].method: (absent) -> "dynamic"' in out["text"].stdout
    assert "validation int8 max abs diff (new variant): - -> " in out["text"].stdout


@check(factory)
def _factory(out: dict[str, Result]) -> None:
    entry = _recipe(out["json"])
    (change,) = [c for c in entry["changes"] if "factory" in c["key"]]  # type: ignore[attr-defined]
    assert change["key"] == "source.pytorch.factory (recipes/steps_model.py)" and change["base"] != change["now"]
    assert entry["invalidated"][0] == "source"  # type: ignore[index]
    (model,) = [m for m in entry["models"] if m["path"] == "model.onnx"]  # type: ignore[attr-defined]
    assert {"what": "op Sigmoid", "base": 1, "now": 0, "unit": ""} in model["changes"]
    assert {"what": "op Tanh", "base": 0, "now": 1, "unit": ""} in model["changes"]
    assert model["drift"]["gated"] > 0 and model["drift"]["pooled"] == 0.0  # only the gate changed
    assert "    model.onnx: op Tanh: 0 -> 1" in out["text"].stdout
    assert "| `model.onnx` | op Sigmoid | 1 | 0 |" in out["md"].stdout
    assert "output drift on the validation inputs" in out["md"].stdout


@check(package)
def _package(out: dict[str, Result]) -> None:
    import onnx

    entry = _recipe(out["json"])
    assert {"key": "package onnx", "change": "changed", "base": "1.16.0", "now": onnx.__version__} in entry["changes"]  # type: ignore[operator]
    assert {"source", "export", "check"} <= set(entry["invalidated"]) and "validate" in entry["invalidated"]  # type: ignore[arg-type, operator]
    assert f'  package onnx: "1.16.0" -> "{onnx.__version__}"' in out["text"].stdout
    assert f'| `package onnx` | "1.16.0" | "{onnx.__version__}" |' in out["md"].stdout
    assert entry["figures"] == "unchanged"  # both sides are this environment's build, read from the remote


@check(rename)
def _rename(out: dict[str, Result]) -> None:
    entry = _recipe(out["json"])
    assert entry["path"] == "recipes/two-by-two.yaml" and entry["status"] == "renamed from recipes/steps.yaml"
    assert entry["changes"] == [] and entry["figures"] == "unchanged"
    assert "recipes/two-by-two.yaml: renamed from recipes/steps.yaml" in out["text"].stdout
    assert "### `recipes/two-by-two.yaml`: renamed from recipes/steps.yaml" in out["md"].stdout


@check(comment)
def _comment(out: dict[str, Result]) -> None:
    entry = _recipe(out["json"])
    assert entry["status"] == "unchanged" and entry["changes"] == [] and entry["invalidated"] == []
    assert entry["figures"] == "unchanged" and entry["models"] == []
    assert "recipes/steps.yaml: unchanged" in out["text"].stdout
    assert "### `recipes/steps.yaml`: unchanged" in out["md"].stdout


@pytest.mark.parametrize("case", [opset, int8, factory, package, rename, comment], ids=lambda c: c.__name__)
def test_diff_shows_what_a_reviewer_needs(
    case: Callable[[Path], str], origin: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, remote = origin
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True)
    subprocess.run(["git", "checkout", "-qb", "pr"], cwd=work, check=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("ONNXBUILD_CACHE_DIR", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    recipe = case(work)
    runner = CliRunner()
    # the pull request's author builds; their pushes reach the remote
    built = runner.invoke(cli, ["--cache-url", remote, "--cache-dir", str(tmp_path / "author-cache"), "make", recipe])
    assert built.exit_code == 0, built.output
    # a fresh CI runner: no cache of its own, figures only from the remote
    out = {
        fmt: runner.invoke(
            cli,
            [
                "--cache-url",
                remote,
                "--cache-dir",
                str(tmp_path / "runner-cache"),
                "diff",
                "--base",
                "main",
                "--format",
                fmt,
                "--detailed-exitcode",
            ],
        )
        for fmt in ("text", "md", "json")
    }
    for fmt, result in out.items():
        assert result.exit_code == (0 if case is comment else 2), f"{fmt}: {result.output}"
        assert "Traceback" not in result.output
    CHECKS[case.__name__](out)


def test_the_summary_says_what_the_change_costs_first(
    origin: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, remote = origin
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("ONNXBUILD_CACHE_DIR", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    with (work / RECIPE).open("a", encoding="utf-8") as f:
        f.write("quantize:\n  - {name: q8, method: dynamic, per_channel: false}\n")  # a variant nobody built
    cache = ["--cache-url", remote, "--cache-dir", str(tmp_path / "runner-cache")]
    text = CliRunner().invoke(cli, [*cache, "diff", "--base", "main"])
    # the new variant's quantize and validate steps and the report and benchmark that list it
    # are to build; source, export, check and validate of the model and the machine's peaks come from the remote
    expected = (
        "1 of 1 recipe changed; 4 steps to build, 5 from the remote cache, 0 cached; not built here before: no estimate"
    )
    assert text.stdout.splitlines()[2] == expected, text.stdout
    data = json.loads(CliRunner().invoke(cli, [*cache, "diff", "--base", "main", "--format", "json"]).stdout)
    assert data["summary"] == {
        "recipes": 1,
        "changed": 1,
        "to_build": 4,
        "from_remote": 0,
        "cached": 5,
        "estimate_s": None,
    }  # pulled by the first diff
    md = CliRunner().invoke(cli, [*cache, "diff", "--base", "main", "--format", "md"]).stdout
    assert (
        md.splitlines()[2]
        == f"**{expected.replace('5 from the remote cache, 0 cached', '0 from the remote cache, 5 cached')}**"
    )
