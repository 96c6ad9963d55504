"""Trust boundaries: nothing a recipe or a work tree holds makes a build write or delete outside artifacts/.

A cloned repository, or a pull request that CI builds, controls the recipes and may also
hold an artifacts/ folder: names with ``..`` or ``/``, symbolic links, and a manifest.json
listing paths of its choice. Builds must refuse the first two and ignore the third.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers_engine import fake, plan_fakes, register_fake

from onnxbuild.cli import cli
from onnxbuild.engine.cache import Cache
from onnxbuild.engine.runner import execute
from onnxbuild.errors import UsageError

CORPUS = Path(__file__).resolve().parent / "data" / "corpus"
LR = "recipes/linear-regression.yaml"


def tree(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` (links not followed) with what it is: its bytes' text, or where it links."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        out[rel] = (
            f"-> {p.readlink()}"
            if p.is_symlink()
            else ("dir" if p.is_dir() else p.read_bytes().decode("utf-8", "replace"))
        )
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the project holding files a build must never touch."""
    folder = tmp_path.parent / f"{tmp_path.name}-outside"
    for rel in ("keep.txt", "source/keep.txt", "check/keep.txt", "reports/keep.txt"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"{rel} must survive\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("name", ["name-dotdot", "name-absolute", "quantize-name-dotdot"])
def test_a_name_that_leads_out_of_artifacts_is_refused_before_anything_is_written(project: Path, name: str) -> None:
    shutil.copy(CORPUS / f"{name}.yaml", project / "recipes" / "evil.yaml")
    before = tree(project)
    result = CliRunner().invoke(cli, ["make", "recipes/evil.yaml"])
    assert result.exit_code == 2
    assert "name: must be a" in result.output
    assert tree(project) == before  # artifacts/../evil would be project/evil
    assert not Path("/abs").exists()


@pytest.mark.parametrize("name", ["../evil", "..", "{project}/evil"])
def test_the_runner_refuses_such_a_name_even_if_it_gets_one(
    project: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Names are checked when a recipe is loaded; the runner checks again where it writes,
    # for recipes that reach it another way (the API, a resolved-recipe memo). The absolute
    # name points into the test's own folder, so a regression writes nowhere else.
    register_fake()
    cache = Cache(project / "cache")
    plan = plan_fakes(monkeypatch, cache, {name.format(project=project): [fake("a")]})
    with pytest.raises(
        UsageError, match=r"outside .*artifacts/ \(a symbolic link\?\); onnxbuild writes artifacts only inside"
    ):
        execute(plan, cache, project / "artifacts", in_process=True)
    assert not (project / "evil").exists()
    assert list((project / "cache" / "entries").rglob("*.json")) == []  # refused before any step ran


def test_an_artifact_folder_linked_outside_is_refused(project: Path, outside: Path) -> None:
    (project / "artifacts").mkdir()
    (project / "artifacts" / "linear-regression").symlink_to(outside, target_is_directory=True)
    before = tree(outside)
    result = CliRunner().invoke(cli, ["make", LR])
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"Error: artifacts/linear-regression leads to {outside}, outside artifacts/ (a symbolic link?); "
        "onnxbuild writes artifacts only inside artifacts/: remove the link, or pass --artifacts-dir\n"
    )
    assert tree(outside) == before
    assert list((project / ".onnxbuild" / "cache" / "entries").rglob("*.json")) == []


def test_a_folder_inside_the_artifacts_linked_outside_is_refused(project: Path, outside: Path) -> None:
    (project / "artifacts" / "linear-regression").mkdir(parents=True)
    (project / "artifacts" / "linear-regression" / "reports").symlink_to(outside / "reports", target_is_directory=True)
    before = tree(outside)
    result = CliRunner().invoke(cli, ["make", LR])
    assert result.exit_code == 2
    assert result.stderr.endswith(
        f"Error: artifacts/linear-regression/reports leads to {outside / 'reports'}, outside "
        "artifacts/linear-regression/ (a symbolic link?); onnxbuild writes artifacts only inside it: remove the "
        "link\n"
    )
    assert tree(outside) == before


def test_a_planted_manifest_and_failed_link_delete_nothing_outside(
    project: Path, outside: Path, tmp_path: Path
) -> None:
    # The artifacts root itself may be a link (to a bigger disk, say): that is allowed.
    disk = tmp_path / "disk"
    disk.mkdir()
    (project / "artifacts").symlink_to(disk, target_is_directory=True)
    folder = disk / "linear-regression"
    folder.mkdir()
    # A manifest from "an earlier build" listing files this build does not produce, which
    # the runner removes as stale (up out of the folder, absolute, empty, not text); and failed/ linked to a folder
    # with source/ and check/, which a successful build clears as failed/<step>.
    climbing = os.path.relpath(outside / "keep.txt", folder)
    assert climbing.startswith("../") and (folder / climbing).resolve() == outside / "keep.txt"
    paths = (climbing, str(outside / "source" / "keep.txt"), "", 5)  # and two a manifest never holds
    planted = [{"path": path, "sha256": "0" * 64, "bytes": 1} for path in paths]
    (folder / "manifest.json").write_text(
        json.dumps({"steps": [{"name": "export", "outputs": planted}]}), encoding="utf-8"
    )
    (folder / "failed").symlink_to(outside, target_is_directory=True)
    before = tree(outside)

    result = CliRunner().invoke(cli, ["make", LR])
    assert result.exit_code == 0, result.output
    assert tree(outside) == before
    assert (folder / "model.onnx").is_file()  # built, through the linked artifacts root


def test_a_cache_entry_naming_a_path_outside_is_a_damaged_entry(project: Path) -> None:
    # Entries can come from a shared remote cache, which other machines write to.
    assert CliRunner().invoke(cli, ["make", LR]).exit_code == 0
    [check] = [
        p
        for p in (project / ".onnxbuild" / "cache" / "entries").rglob("*.json")
        if json.loads(p.read_text(encoding="utf-8"))["step"] == "check"
    ]
    entry = json.loads(check.read_text(encoding="utf-8"))
    entry["outputs"][0]["path"] = "../../evil.json"
    check.write_text(json.dumps(entry), encoding="utf-8")
    shutil.rmtree(project / "artifacts")

    result = CliRunner().invoke(cli, ["make", LR])
    assert result.exit_code == 0, result.output
    assert (
        f"warning: cache entry {check.stem[:12]} is damaged (output path '../../evil.json' leads out of the "
        "artifact folder); rebuilding" in result.stderr
    )
    timings = json.loads((project / "artifacts" / "linear-regression" / "timings.json").read_text(encoding="utf-8"))
    assert {name: s["status"] for name, s in timings["steps"].items()} == {"source": "cached", "check": "built"}
    assert not (project / "evil.json").exists() and not (project.parent / "evil.json").exists()


def test_clean_removes_a_linked_artifact_folder_as_a_link_and_leaves_its_target(tmp_path: Path) -> None:
    import onnxbuild as ob

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine", encoding="utf-8")
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / "linked").symlink_to(outside, target_is_directory=True)
    removed = ob.clean([], ob.Settings(cache_dir=tmp_path / "cache", artifacts_dir=root))
    assert removed == [root / "linked"] and not (root / "linked").exists()
    assert (outside / "keep.txt").read_text(encoding="utf-8") == "mine"
