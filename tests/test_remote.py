"""The remote cache: two checkouts sharing one file:// remote build a recipe once; pulls are verified."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers_engine import Recorder, outcomes

import onnxbuild

ROOT = Path(__file__).resolve().parent.parent
LR = "recipes/linear-regression.yaml"


def checkout(tmp_path: Path, name: str) -> Path:
    where = tmp_path / name
    shutil.copytree(ROOT / "recipes", where / "recipes")
    return where


def settings_for(where: Path, url: str, **kw: bool) -> onnxbuild.Settings:
    return onnxbuild.Settings(
        cache_dir=where / ".onnxbuild" / "cache", artifacts_dir=where / "artifacts", cache_url=url, **kw
    )


def test_two_checkouts_sharing_a_file_remote_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = (tmp_path / "remote").as_uri()
    a, b = checkout(tmp_path, "a"), checkout(tmp_path, "b")
    monkeypatch.chdir(a)
    first = onnxbuild.build([LR], settings_for(a, url))
    assert [s["status"] for s in first.recipes[0].steps] == ["built", "built"]
    assert len(list((tmp_path / "remote" / "entries").glob("*/*.json"))) == 2

    monkeypatch.chdir(b)
    second = onnxbuild.build([LR], settings_for(b, url))
    assert [s["status"] for s in second.recipes[0].steps] == ["cached", "cached"]
    assert [s["reason"] for s in second.recipes[0].steps] == [
        "pulled from the remote cache"
    ] * 2  # provenance, not just "cached"
    third = onnxbuild.build([LR], settings_for(b, url))
    assert [s["reason"] for s in third.recipes[0].steps] == ["up to date"] * 2
    assert (b / "artifacts" / "linear-regression" / "model.onnx").read_bytes() == (
        a / "artifacts" / "linear-regression" / "model.onnx"
    ).read_bytes()
    assert not list((tmp_path / "remote").rglob("*.tmp"))


def test_a_tampered_remote_object_is_refused_and_the_step_built_locally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = (tmp_path / "remote").as_uri()
    a, b = checkout(tmp_path, "a"), checkout(tmp_path, "b")
    monkeypatch.chdir(a)
    onnxbuild.build([LR], settings_for(a, url), in_process=True)
    for obj in (tmp_path / "remote" / "objects").glob("*/*"):
        obj.write_bytes(obj.read_bytes()[:-1] + b"!")  # same size, wrong bytes
    monkeypatch.chdir(b)
    recorder = Recorder()
    report = onnxbuild.build([LR], settings_for(b, url), in_process=True, reporter=recorder)
    assert report.ok
    assert outcomes(report)["linear-regression:source"][0] == "built"
    assert any("does not match its digest; ignoring the remote entry" in w for w in recorder.warnings)


def test_read_only_pulls_but_never_pushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "memory://onnxbuild-test-read-only"
    a = checkout(tmp_path, "a")
    monkeypatch.chdir(a)
    onnxbuild.build([LR], settings_for(a, url, cache_read_only=True), in_process=True)
    import fsspec

    fs = fsspec.filesystem("memory")
    assert not fs.exists("/onnxbuild-test-read-only/entries")
    onnxbuild.build([LR], settings_for(a, url), in_process=True, force=True)  # a trusted build pushes what it builds
    assert len(fs.glob("/onnxbuild-test-read-only/entries/*/*.json")) == 2
    fs.rm("/onnxbuild-test-read-only", recursive=True)


def test_project_config_names_the_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from onnxbuild.cli import cli

    a = checkout(tmp_path, "a")
    remote = tmp_path / "shared"
    (a / "pyproject.toml").write_text(f'[tool.onnxbuild]\ncache_url = "{remote.as_uri()}"\n', encoding="utf-8")
    monkeypatch.chdir(a)
    result = CliRunner().invoke(cli, ["make", LR])
    assert result.exit_code == 0, result.output
    assert len(list((remote / "entries").glob("*/*.json"))) == 2


def test_cache_verify_remote_finds_and_repairs_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from onnxbuild.cli import cli

    url = (tmp_path / "remote").as_uri()
    a = checkout(tmp_path, "a")
    monkeypatch.chdir(a)
    assert onnxbuild.build([LR], settings_for(a, url), in_process=True).ok
    # one entry unreadable, and an object of the other entry wrong (keys hold the code's digest,
    # so which entry sorts first changes with the code: chosen by content, not order)
    entries = sorted((tmp_path / "remote" / "entries").glob("*/*.json"))
    kept = json.loads(entries[1].read_text(encoding="utf-8"))
    sha = kept["outputs"][0]["sha256"]
    obj = tmp_path / "remote" / "objects" / sha[:2] / sha
    obj.write_bytes(obj.read_bytes()[:-1] + b"!")  # same size, wrong bytes
    entries[0].write_text("{", encoding="utf-8")
    first = CliRunner().invoke(cli, ["cache", "verify", "--remote", "--cache-url", url])
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[-1] == "checked 2 remote cache entries; 2 problems"
    assert any("unreadable (JSONDecodeError); re-pushed from the local cache" in line for line in lines)
    assert any("does not match its digest; re-pushed from the local cache" in line for line in lines)
    again = CliRunner().invoke(cli, ["cache", "verify", "--remote", "--cache-url", url])
    assert again.stdout.splitlines()[-1] == "checked 2 remote cache entries; 0 problems"
    b = checkout(tmp_path, "b")
    monkeypatch.chdir(b)
    pulled = onnxbuild.build([LR], settings_for(b, url), in_process=True)
    assert [s["reason"] for s in pulled.recipes[0].steps] == ["pulled from the remote cache"] * 2
    assert (
        CliRunner()
        .invoke(cli, ["cache", "verify", "--remote"])
        .stderr.startswith("Error: --remote needs a remote cache")
    )


def test_plan_looks_at_the_remote_cache_without_downloading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from onnxbuild.cli import cli

    url = (tmp_path / "remote").as_uri()
    a = checkout(tmp_path, "a")
    monkeypatch.chdir(a)
    assert onnxbuild.build([LR], settings_for(a, url), in_process=True).ok
    b = checkout(tmp_path, "b")
    monkeypatch.chdir(b)
    result = CliRunner().invoke(cli, ["--cache-url", url, "plan", LR])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        "linear-regression:source: cached: in the remote cache (make pulls it)",
        "linear-regression:check: cached: in the remote cache (make pulls it)",
        "2 steps to pull from the remote cache",
    ]
    assert not [
        p for p in (b / ".onnxbuild").rglob("*") if p.is_file() and ("objects" in p.parts or "entries" in p.parts)
    ]  # nothing pulled
    report = onnxbuild.build([LR], settings_for(b, url), in_process=True)
    assert [s["reason"] for s in report.recipes[0].steps] == ["pulled from the remote cache"] * 2


def test_a_signed_entry_is_one_object_and_the_two_object_form_of_earlier_versions_is_still_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#40: an entry and its signature travel as one envelope, so two runners pushing different bytes
    for one key cannot pair one's entry with the other's signature. A plain entry with a ``.sig``
    beside it (what earlier versions pushed) is still read, and only with its own signature."""
    import json

    from onnxbuild.engine.signing import SIGNING_ENV, TRUSTED_ENV, Signer, keygen

    remote = tmp_path / "remote"
    url = remote.as_uri()
    public = keygen(tmp_path / "ci.key")
    monkeypatch.setenv(TRUSTED_ENV, public)
    monkeypatch.setenv(SIGNING_ENV, str(tmp_path / "ci.key"))
    ci = checkout(tmp_path, "ci")
    monkeypatch.chdir(ci)
    assert onnxbuild.build([LR], settings_for(ci, url), in_process=True).ok
    monkeypatch.delenv(SIGNING_ENV)
    entries = sorted(remote.glob("entries/*/*.json"))
    assert len(entries) == 2 and not list(remote.glob("entries/*/*.sig"))

    # rewrite them as an earlier version pushed them: the plain entry, its signature beside it
    signer = Signer(tmp_path / "ci.key")
    plain = [json.loads(p.read_text(encoding="utf-8"))["entry"].encode("utf-8") for p in entries]
    for path, data in zip(entries, plain, strict=True):
        path.write_bytes(data)
        path.with_name(path.name + ".sig").write_bytes(signer.sign(data))
    reader = checkout(tmp_path, "reader")
    monkeypatch.chdir(reader)
    report = onnxbuild.build([LR], settings_for(reader, url), in_process=True)
    assert [s["reason"] for s in report.recipes[0].steps] == ["pulled from the remote cache"] * 2

    # the pairing the envelope rules out: one entry's signature beside the other entry
    entries[0].with_name(entries[0].name + ".sig").write_bytes(signer.sign(plain[1]))
    recorder = Recorder()
    other = checkout(tmp_path, "other")
    monkeypatch.chdir(other)
    report = onnxbuild.build([LR], settings_for(other, url), in_process=True, reporter=recorder)
    assert report.ok and sum("is not signed by a trusted key" in w for w in recorder.warnings) == 1
