"""<recipe>.lock.json (make --lock, plan --check) and onnxbuild verify (rebuild and compare digests)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from onnxbuild.cli import cli

LR = "recipes/linear-regression.yaml"
LOCK = Path("recipes/linear-regression.lock.json")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_make_lock_then_plan_check_then_a_stale_lock_fails(project: Path) -> None:
    missing = run("plan", "--check", LR)
    assert missing.exit_code == 1
    assert "linear-regression.lock.json does not exist; run `onnxbuild make recipes/linear-regression.yaml --lock` and commit it" in missing.stdout

    built = run("make", LR, "--lock")
    assert built.exit_code == 0, built.output
    first = LOCK.read_bytes()
    assert b'"lock_version": 1' in first and b"model.onnx" in first
    ok = run("plan", "--check", LR)
    assert (ok.exit_code, ok.stdout) == (0, "locks match the recipes\n")

    # A rebuild from scratch in a fresh cache writes the same bytes: the lock merges cleanly.
    run("clean")
    assert run("--cache-dir", "other-cache", "make", LR, "--lock").exit_code == 0
    assert LOCK.read_bytes() == first

    recipe = project / LR
    recipe.write_text(recipe.read_text(encoding="utf-8").replace("seed: 0, distribution", "seed: 1, distribution"), encoding="utf-8")
    stale = run("plan", "--check", LR)
    assert stale.exit_code == 1
    assert stale.stdout == "linear-regression:source: source.graph.initializers[0].random.seed changed 0 -> 1\n"
    assert "Error: the lock files do not match the recipes; run `onnxbuild make RECIPE --lock` and commit the locks" in stale.stderr
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
    assert result.stdout == "linear-regression: byte-identical\n  source               identical\n  check                identical\n"
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
