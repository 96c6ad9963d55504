"""<recipe>.lock.json (make --lock, plan --check) and onnxbuild verify (rebuild and compare digests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from onnxbuild.cli import cli

LR = "recipes/linear-regression.yaml"
LOCK = Path("recipes/linear-regression.lock.json")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_make_lock_then_plan_check_then_a_stale_lock_fails(project: Path) -> None:
    missing = run("plan", "--check", LR)
    assert missing.exit_code == 1
    assert (
        "linear-regression.lock.json does not exist; run `onnxbuild make recipes/linear-regression.yaml --lock` "
        "and commit it" in missing.stdout
    )

    built = run("make", LR, "--lock")
    assert built.exit_code == 0, built.output
    first = LOCK.read_bytes()
    assert b'"lock_version": 2' in first and b"model.onnx" in first and b'"ingredients"' in first
    ok = run("plan", "--check", LR)
    assert (ok.exit_code, ok.stdout) == (0, "locks match the recipes\n")

    # A rebuild from scratch in a fresh cache writes the same bytes: the lock merges cleanly.
    run("clean")
    assert run("--cache-dir", "other-cache", "make", LR, "--lock").exit_code == 0
    assert LOCK.read_bytes() == first

    recipe = project / LR
    recipe.write_text(
        recipe.read_text(encoding="utf-8").replace("seed: 0, distribution", "seed: 1, distribution"), encoding="utf-8"
    )
    stale = run("plan", "--check", LR)
    assert stale.exit_code == 1
    assert stale.stdout == "linear-regression:source: source.graph.initializers[0].random.seed changed 0 -> 1\n"
    assert (
        "Error: the lock files do not match the recipes; run `onnxbuild make RECIPE --lock` and commit the locks"
        in stale.stderr
    )
    assert not (project / "artifacts" / "linear-regression" / "failed").exists()


def test_lock_needs_a_whole_build(project: Path) -> None:
    result = run("make", LR, "--target", "source", "--lock")
    assert result.exit_code == 2
    assert "--lock records whole builds; drop --target" in result.stderr
    assert not (project / "artifacts").exists()


def test_verify_rebuilds_in_a_throwaway_cache_and_finds_every_digest_identical(project: Path) -> None:
    assert run("make", LR).exit_code == 0
    cache_before = sorted(p.name for p in (project / ".onnxbuild" / "cache" / "entries").rglob("*.json"))
    result = run("verify", LR)
    assert result.exit_code == 0, result.output
    assert (
        result.stdout
        == "linear-regression: byte-identical\n  source               identical\n  check                identical\n"
    )
    assert sorted(p.name for p in (project / ".onnxbuild" / "cache" / "entries").rglob("*.json")) == cache_before


def test_verify_reports_an_artifact_that_differs(project: Path) -> None:
    import json

    assert run("make", LR).exit_code == 0
    manifest = project / "artifacts" / "linear-regression" / "manifest.json"
    data = json.loads(manifest.read_text(encoding="utf-8"))
    data["steps"][0]["outputs"][0]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data), encoding="utf-8")
    result = run("verify", LR)
    assert result.exit_code == 1
    assert "  source               differs  (model.onnx differ from the manifest)" in result.stdout
    assert "Error: some artifacts are not byte-reproducible" in result.stderr


def test_plan_check_explains_a_stale_lock_from_the_lock_alone(project: Path) -> None:
    """On a CI runner the cache is empty: the reasons come from the ingredients in the lock."""
    import json

    from onnxbuild.engine.cache import step_key

    assert run("make", LR, "--lock").exit_code == 0
    lock = json.loads(LOCK.read_text(encoding="utf-8"))
    # the lock as another machine with an older onnx wrote it
    source = lock["steps"]["source"]
    source["ingredients"]["packages"]["onnx"] = "1.0.0"
    source["key"] = step_key(source["ingredients"])
    LOCK.write_text(json.dumps(lock), encoding="utf-8")
    from onnxbuild.environment import package_version

    fresh = run("--cache-dir", "fresh-runner-cache", "plan", "--check", LR)
    assert fresh.exit_code == 1
    assert fresh.stdout.splitlines()[0] == f"linear-regression:source: onnx changed 1.0.0 -> {package_version('onnx')}"


@pytest.mark.slow  # two cold builds with a benchmark: make test-slow
def test_a_lock_with_a_benchmark_is_the_same_after_a_cold_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timings are measurements: the benchmark's outputs are listed, not locked."""
    import json
    import shutil

    shutil.copytree(Path(__file__).parent / "data" / "steps", tmp_path / "steps")
    monkeypatch.chdir(tmp_path)
    assert run("make", "steps/steps.yaml", "--lock").exit_code == 0
    lock = tmp_path / "steps" / "steps.lock.json"
    first = lock.read_bytes()
    bench = json.loads(first)["steps"]["benchmark"]
    assert bench["measured"] is True and bench["outputs"] == ["benchmark.json", "benchmark.md", "benchmark.png"]
    assert run("--cache-dir", "cold", "make", "steps/steps.yaml", "--lock").exit_code == 0
    assert lock.read_bytes() == first


def test_make_frozen_refuses_a_poisoned_remote_entry_naming_both_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone with write access points the remote's entry for the recipe's source step at
    another valid model (B = 0.25 for the recipe's 0.5): a fresh runner with --frozen fails."""
    import json
    import shutil

    root = Path(__file__).resolve().parent.parent
    remote = (tmp_path / "remote").as_uri()
    for name in ("ci", "attacker", "runner"):
        shutil.copytree(root / "recipes", tmp_path / name / "recipes")
    monkeypatch.chdir(tmp_path / "ci")
    assert run("--cache-url", remote, "make", LR, "--lock").exit_code == 0
    lock = json.loads(LOCK.read_text(encoding="utf-8"))
    good = lock["steps"]["source"]["outputs"]["model.onnx"]
    # the attacker builds another model and rewires the entry the lock's key names to it
    monkeypatch.chdir(tmp_path / "attacker")
    other = tmp_path / "attacker" / LR
    other.write_text(
        other.read_text(encoding="utf-8").replace("values: [0.5, -0.5]", "values: [0.25, -0.5]"), encoding="utf-8"
    )
    assert run("--cache-url", remote, "make", LR).exit_code == 0
    evil = json.loads(
        (tmp_path / "attacker" / "artifacts" / "linear-regression" / "manifest.json").read_text(encoding="utf-8")
    )
    evil_out = next(s for s in evil["steps"] if s["name"] == "source")["outputs"]
    key = lock["steps"]["source"]["key"]
    entry_path = tmp_path / "remote" / "entries" / key[:2] / f"{key}.json"
    entry = json.loads(entry_path.read_text(encoding="utf-8"))
    entry["outputs"] = evil_out
    entry_path.write_text(json.dumps(entry), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "runner")
    shutil.copy(tmp_path / "ci" / LOCK, tmp_path / "runner" / LOCK)
    unfrozen_check = run("--cache-dir", "c1", "plan", "--check", LR)
    assert unfrozen_check.exit_code == 0  # the lock matches the recipe: only the outputs can tell
    frozen = run("--cache-url", remote, "--cache-dir", "c2", "make", LR, "--frozen")
    assert frozen.exit_code == 1, frozen.output
    bad = next(o["sha256"] for o in evil_out if o["path"] == "model.onnx")
    assert f"step source failed: --frozen: model.onnx has sha256 {bad[:16]}, the lock says {good[:16]}" in frozen.stderr
    assert not (tmp_path / "runner" / "artifacts" / "linear-regression" / "model.onnx").exists()
    # without the poison, the same runner builds and passes
    entry_path.unlink()
    again = run("--cache-url", remote, "--cache-dir", "c2", "make", LR, "--frozen")
    assert again.exit_code == 0, again.output


def test_frozen_needs_a_current_lock(project: Path) -> None:
    result = run("make", LR, "--frozen")
    assert result.exit_code == 1
    assert "--frozen: the lock files do not match the recipes:" in result.stderr and "does not exist" in result.stderr


def test_plan_check_json(project: Path) -> None:
    import json

    missing = run("plan", "--check", "--json", LR)
    assert missing.exit_code == 1
    data = json.loads(missing.stdout)
    assert data["up_to_date"] is False and "does not exist" in data["problems"][0]
    assert run("make", LR, "--lock").exit_code == 0
    ok = run("plan", "--check", "--json", LR)
    assert ok.exit_code == 0 and json.loads(ok.stdout) == {"up_to_date": True, "problems": []}


def test_the_readme_ci_workflow_with_a_file_remote_and_two_fresh_runners(tmp_path: Path) -> None:
    """The README's GitHub Actions steps, as written, on two runners with empty caches that
    share a file:// remote: main builds and locks; a pull request changes a recipe; each
    runner checks the locks, builds --frozen, and writes the diff for the job summary."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    repo = tmp_path / "repo"
    shutil.copytree(root / "recipes", repo / "recipes")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    env = {**os.environ, "ONNXBUILD_CACHE_URL": (tmp_path / "remote").as_uri(), "HF_HUB_OFFLINE": "1"}
    env.pop("ONNXBUILD_CACHE_DIR", None)

    def onnxbuild(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "onnxbuild", *args], cwd=where, env=env, capture_output=True, text=True, timeout=600
        )

    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    assert onnxbuild(repo, "make", LR, "--lock").returncode == 0  # main's job writes the lock and fills the remote
    subprocess.run([*git, "add", "recipes"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "main"], cwd=repo, check=True)
    shutil.rmtree(repo / ".onnxbuild")
    shutil.rmtree(repo / "artifacts")
    # the pull request: B changes, lock updated by its author
    subprocess.run([*git, "checkout", "-qb", "pr"], cwd=repo, check=True)
    recipe = repo / LR
    recipe.write_text(
        recipe.read_text(encoding="utf-8").replace("values: [0.5, -0.5]", "values: [0.5, -0.25]"), encoding="utf-8"
    )
    assert onnxbuild(repo, "--cache-dir", str(tmp_path / "author-cache"), "make", LR, "--lock").returncode == 0
    subprocess.run([*git, "commit", "-qam", "pr"], cwd=repo, check=True)
    shutil.rmtree(repo / "artifacts")
    for runner in ("runner-1", "runner-2"):
        work = tmp_path / runner
        subprocess.run(["git", "clone", "-q", "-b", "pr", str(repo), str(work)], check=True)
        subprocess.run(["git", "fetch", "-q", "origin", "main:main"], cwd=work, check=True)
        check = onnxbuild(work, "plan", "--check", "recipes/linear-regression.yaml")
        assert check.returncode == 0, check.stdout + check.stderr
        build = onnxbuild(work, "make", "recipes/linear-regression.yaml", "-j", "2", "--frozen", "--json")
        assert build.returncode == 0, build.stderr
        steps = json.loads(build.stdout)["recipes"][0]["steps"]
        assert [s["reason"] for s in steps] == ["pulled from the remote cache"] * 2  # the author's build pushed them
        summary = work / "summary.md"
        diff = subprocess.run(
            [sys.executable, "-m", "onnxbuild", "diff", "--base", "main", "--format", "md"],
            cwd=work,
            env={**env, "GITHUB_STEP_SUMMARY": str(summary)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert diff.returncode == 0, diff.stderr
        assert "| `source.graph.initializers[1].values[1]` | -0.5 | -0.25 |" in diff.stdout
        assert summary.read_text(encoding="utf-8") == diff.stdout
