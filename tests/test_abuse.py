"""Reliability, round two (issue 14): each scenario broke a promise before its fix.

Builds use recipes/linear-regression.yaml (a 2-node graph, about a second), mostly in
process so that a table of scenarios stays cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_cli import run
from helpers_engine import Recorder

import onnxbuild
from onnxbuild.engine.cache import TAG_NAME, Cache

ROOT = Path(__file__).resolve().parent.parent
LR = "recipes/linear-regression.yaml"


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def cache_of(project: Path) -> Path:
    return project / ".onnxbuild" / "cache"


# ---------------------------------------------------------------- 1. nothing outside the cache is deleted


def test_a_symlinked_cache_subfolder_is_refused_and_nothing_outside_is_deleted(project: Path) -> None:
    outside = project.parent / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "data.txt").write_text("keep me\n", encoding="utf-8")
    cache_of(project).mkdir(parents=True)
    (cache_of(project) / "tmp").symlink_to(outside, target_is_directory=True)
    result = run("make", LR)
    assert result.exit_code == 1
    assert (
        result.stderr
        == "Error: .onnxbuild/cache/tmp is a symbolic link; onnxbuild deletes inside its cache folders and never "
        "follows links: remove the link (onnxbuild makes the folder again)\n"
    )
    assert (outside / "precious" / "data.txt").read_text(encoding="utf-8") == "keep me\n"


def test_a_folder_onnxbuild_did_not_make_is_refused_as_a_cache(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    for sub in ("tmp/old-build", "objects/ab"):
        (home / sub).mkdir(parents=True)
    (home / "tmp" / "old-build" / "notes.txt").write_text("mine\n", encoding="utf-8")
    (home / "objects" / "ab" / "photo.jpg").write_bytes(b"\xff\xd8")
    (home / ".bashrc").write_text("# mine\n", encoding="utf-8")
    for command in (("make", LR), ("gc",), ("cache", "verify")):
        result = run("--cache-dir", str(home), *command)
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr.startswith(
            f"Error: {home} is not an onnxbuild cache (no {TAG_NAME}, "
            "and it holds .bashrc, objects/ab, tmp/old-build); "
        ), result.stderr
    assert (home / "tmp" / "old-build" / "notes.txt").is_file() and (home / "objects" / "ab" / "photo.jpg").is_file()


def test_a_cache_another_build_is_creating_at_that_moment_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds started at once on a new cache: one made the folder and is writing the tag
    when the other looks for it (seen in CI: "no CACHEDIR.TAG, and it holds CACHEDIR.TAG").
    Unit test of the engine: the first look for the tag misses, as it did in that race."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / TAG_NAME).write_text("", encoding="utf-8")  # the other build's tag, still being written
    real = Path.is_file
    missed: list[Path] = []

    def late(self: Path) -> bool:
        if self.name == TAG_NAME and not missed:
            missed.append(self)
            return False
        return real(self)

    monkeypatch.setattr(Path, "is_file", late)
    Cache(root).ensure_writable()
    assert missed and all((root / sub).is_dir() for sub in ("objects", "entries", "tmp"))


def test_a_new_cache_is_tagged_and_a_look_alike_without_the_tag_is_refused(
    project: Path, settings: onnxbuild.Settings, tmp_path: Path
) -> None:
    """#39: a folder with onnxbuild's subfolder names (tmp/, objects/) holding files, and no tag,
    was adopted: make wrote the tag and emptied its tmp/, gc deleted in its objects/. Names
    prove nothing about an owner; only empty folders (or onnxbuild's lock files) are taken."""
    assert onnxbuild.build([LR], settings, in_process=True).ok
    tag = cache_of(project) / TAG_NAME
    assert tag.read_text(encoding="utf-8").startswith("Signature: 8a477f597d28d172789f06886806bc55")
    look_alike = tmp_path / "look-alike"
    for sub in ("tmp/job-1", "objects/ab"):
        (look_alike / sub).mkdir(parents=True)
    (look_alike / "tmp" / "job-1" / "draft.txt").write_text("mine\n", encoding="utf-8")
    (look_alike / "objects" / "ab" / "abc").write_bytes(b"mine")
    for command in (("make", LR), ("gc",), ("cache", "verify")):
        result = run("--cache-dir", str(look_alike), *command)
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr == (
            f"Error: {look_alike} is not an onnxbuild cache (no {TAG_NAME}, and it holds objects/ab, tmp/job-1); "
            "onnxbuild deletes inside its cache, so it uses only a new or empty folder: pass another --cache-dir "
            "or ONNXBUILD_CACHE_DIR\n"
        )
    assert (look_alike / "tmp" / "job-1" / "draft.txt").is_file() and (
        look_alike / "objects" / "ab" / "abc"
    ).read_bytes() == b"mine"
    assert not (look_alike / TAG_NAME).exists()
    empty = tmp_path / "empty-subfolders"  # onnxbuild's own names, nothing in them: taken and tagged
    for sub in ("objects", "tmp", "locks"):
        (empty / sub).mkdir(parents=True)
    (empty / "locks" / "gc.lock").write_text("", encoding="utf-8")
    assert run("--cache-dir", str(empty), "gc").exit_code == 0
    assert (empty / TAG_NAME).is_file()


def test_gc_never_follows_a_link_inside_objects(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    outside = project.parent / "outside-objects"
    outside.mkdir()
    (outside / "family.jpg").write_bytes(b"\xff\xd8")
    (cache_of(project) / "objects" / "zz").symlink_to(outside, target_is_directory=True)
    assert run("gc").exit_code == 0
    assert (outside / "family.jpg").is_file()


# ---------------------------------------------------------------- 2. gc and clean during make


def test_gc_and_cache_verify_refuse_while_a_build_uses_the_cache(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    building = Cache(cache_of(project)).maintenance_lock(shared=True)  # what a running make holds
    building.acquire()
    try:
        for command, name in ((("gc",), "gc"), (("cache", "verify"), "cache verify")):
            result = run(*command)
            assert result.exit_code == 1
            assert (
                result.stderr
                == f"Error: another onnxbuild is building with the cache .onnxbuild/cache; {name} would delete "
                "what it is using: run it again when that build ends\n"
            )
        other = Cache(cache_of(project)).maintenance_lock(shared=True)
        assert other.try_acquire()  # builds share the cache with each other
        other.release()
    finally:
        building.release()
    assert run("gc").exit_code == 0


def test_clean_refuses_while_the_recipe_is_being_built(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    lock = Cache(cache_of(project)).lock("recipe-linear-regression")
    lock.acquire()
    try:
        result = run("clean", LR)
        assert result.exit_code == 1
        assert (
            result.stderr
            == "Error: another onnxbuild is building linear-regression; run `onnxbuild clean` again when it ends\n"
        )
        assert (project / "artifacts" / "linear-regression" / "model.onnx").is_file()
    finally:
        lock.release()
    assert run("clean", LR).exit_code == 0


# ---------------------------------------------------------------- 3. damaged cache files are misses


def _entries(project: Path) -> list[Path]:
    return sorted((cache_of(project) / "entries").glob("*/*.json"))


def _non_utf8(path: Path) -> None:
    path.write_bytes(bytes(range(128, 256)))


def _a_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")


def _bad_outputs(path: Path) -> None:
    entry = json.loads(path.read_text(encoding="utf-8"))
    entry["outputs"] = ["model.onnx"]
    path.write_text(json.dumps(entry), encoding="utf-8")


@pytest.mark.parametrize(
    "damage", [_non_utf8, _a_folder, _deep, _bad_outputs], ids=["non-utf8", "folder", "deep", "outputs-of-strings"]
)
def test_a_damaged_entry_is_a_warned_miss_for_make_plan_and_gc(
    project: Path, settings: onnxbuild.Settings, damage: Callable[[Path], None]
) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    for entry in _entries(project):
        damage(entry)
    plan = run("plan", LR)
    assert plan.exit_code == 1 and "Traceback" not in plan.output
    recorder = Recorder()
    report = onnxbuild.build([LR], settings, in_process=True, reporter=recorder)
    assert report.ok
    assert [s["status"] for s in report.recipes[0].steps] == ["built", "built"]
    assert any("cache entry" in w and "rebuilding" in w for w in recorder.warnings), recorder.warnings
    assert run("gc").exit_code == 0 and run("cache", "verify").exit_code == 0
    assert run("plan", LR).exit_code == 0


@pytest.mark.parametrize(
    ("where", "content"),
    [
        ("last/linear-regression.json", "[1, 2]"),
        ("last/linear-regression.json", '{"source": 3}'),
        ("state/hashes.json", "[1, 2]"),
        ("state/hashes.json", '{"x": 1}'),
        ("last/linear-regression.json", None),
    ],
)
def test_damaged_state_files_are_forgotten_not_fatal(
    project: Path, settings: onnxbuild.Settings, where: str, content: str | None
) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    path = cache_of(project) / where
    path.unlink()
    if content is None:
        path.mkdir()
    else:
        path.write_text(content, encoding="utf-8")
    assert run("plan", LR).exit_code == 0
    assert run("make", LR).exit_code == 0
    assert run("make", LR, "--force").exit_code == 0
    assert run("gc").exit_code == 0
    assert json.loads((cache_of(project) / "last" / "linear-regression.json").read_text(encoding="utf-8"))["check"][
        "key"
    ]


def test_a_malformed_remote_entry_is_built_locally_and_replaced(project: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    url = remote.as_uri()
    first = onnxbuild.Settings(cache_dir=tmp_path / "a-cache", artifacts_dir=tmp_path / "a-artifacts", cache_url=url)
    assert onnxbuild.build([LR], first, in_process=True).ok
    entries = sorted(remote.glob("entries/*/*.json"))
    good = [p.read_text(encoding="utf-8") for p in entries]
    _bad_outputs(entries[0])
    _deep(entries[1])
    recorder = Recorder()
    second = onnxbuild.Settings(cache_dir=tmp_path / "b-cache", artifacts_dir=tmp_path / "b-artifacts", cache_url=url)
    report = onnxbuild.build([LR], second, in_process=True, reporter=recorder)
    assert report.ok
    assert [s["status"] for s in report.recipes[0].steps] == ["built", "built"]
    assert sum("remote cache entry" in w for w in recorder.warnings) == 2, recorder.warnings
    # the good build pushed its entries over the damaged ones
    assert [json.loads(p.read_text(encoding="utf-8")) for p in entries] == [json.loads(t) for t in good]
    third = onnxbuild.Settings(cache_dir=tmp_path / "c-cache", artifacts_dir=tmp_path / "c-artifacts", cache_url=url)
    assert [s["status"] for s in onnxbuild.build([LR], third, in_process=True).recipes[0].steps] == ["cached", "cached"]


# ---------------------------------------------------------------- 5. the manifest is byte-identical


def test_a_no_op_rebuild_leaves_the_manifest_byte_identical(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    manifest = project / "artifacts" / "linear-regression" / "manifest.json"
    first = manifest.read_bytes()
    report = onnxbuild.build([LR], settings, in_process=True)
    assert [s["status"] for s in report.recipes[0].steps] == ["cached", "cached"]
    assert manifest.read_bytes() == first
    assert b'"status"' not in first and b'"reason"' not in first
    timings = json.loads((project / "artifacts" / "linear-regression" / "timings.json").read_text(encoding="utf-8"))
    assert {n: (s["status"], s["reason"]) for n, s in timings["steps"].items()} == {
        "source": ("cached", "up to date"),
        "check": ("cached", "up to date"),
    }


# ---------------------------------------------------------------- 6. temp files of killed writes


def test_temp_files_of_killed_writes_are_removed_by_the_next_build(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    pid = dead_pid()
    folder = project / "artifacts" / "linear-regression"
    entry = _entries(project)[0]
    planted = [
        folder / f".manifest.json.{pid}-k3j2h1.tmp",
        folder / f".timings.json.{pid}-aa11bb.tmp",
        entry.parent / f".{entry.name}.{pid}-zz99.tmp",
        cache_of(project) / "last" / f".linear-regression.json.{pid}-q1.tmp",
        cache_of(project) / "state" / f".hashes.json.{pid}-w2.tmp",
    ]
    alive = folder / f".manifest.json.{os.getpid()}-mine.tmp"  # a live writer's file is left alone
    for path in [*planted, alive]:
        path.write_text("half", encoding="utf-8")
    assert onnxbuild.build([LR], settings, in_process=True).ok
    assert [p for p in planted if p.exists()] == []
    assert alive.exists()


# ---------------------------------------------------------------- 7. devices and FIFOs


def test_a_recipe_that_is_a_device_is_a_usage_error() -> None:
    result = run("make", "/dev/zero")
    assert result.exit_code == 2
    assert (
        result.stderr.splitlines()[1]
        == "  /dev/zero: is not a regular file (a device, FIFO or socket); name a .yaml file"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_manifest_that_is_a_device_or_fifo_is_not_read(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    manifest = project / "artifacts" / "linear-regression" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to("/dev/zero")
    assert run("gc").exit_code == 0
    assert run("make", LR).exit_code == 0  # replaced by a file, never read
    assert not manifest.is_symlink() and json.loads(manifest.read_text(encoding="utf-8"))["name"] == "linear-regression"
    manifest.unlink()
    os.mkfifo(manifest)
    assert run("gc").exit_code == 0
    assert run("make", LR).exit_code == 0
    shutil.rmtree(project / "artifacts")


# ---------------------------------------------------------------- 8. edits that keep size and mtime


def test_an_in_place_edit_keeping_size_and_mtime_is_caught_by_plan_check_and_verify(project: Path) -> None:
    assert run("make", LR, "--lock").exit_code == 0
    model = project / "artifacts" / "linear-regression" / "model.onnx"
    before = model.stat()
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    with open(model, "r+b") as f:  # in place: the same inode, size and (restored) mtime
        f.write(data)
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    check = run("plan", LR, "--check")
    assert check.exit_code == 1
    assert "artifacts/linear-regression/model.onnx: its bytes differ from the manifest's sha256" in check.stdout
    verify = run("verify", LR)
    assert verify.exit_code == 1
    assert "artifacts" in verify.stdout and "model.onnx: its bytes differ" in verify.stdout


def test_verify_takes_a_manifest_of_the_wrong_shape_as_missing(project: Path) -> None:
    assert run("make", LR).exit_code == 0
    manifest = project / "artifacts" / "linear-regression" / "manifest.json"
    for text in ("[]", '{"steps": "x"}', "{"):
        manifest.write_text(text, encoding="utf-8")
        result = run("verify", LR)
        assert result.exit_code == 2, result.output
        assert (
            result.stderr == "Error: artifacts/linear-regression/manifest.json is missing or unreadable; build first: "
            f"onnxbuild make {LR}\n"
        )
        assert run("gc").exit_code == 0


# ---------------------------------------------------------------- 10. signed remote entries


def test_readers_with_a_trusted_key_take_only_signed_remote_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxbuild.engine.signing import SIGNING_ENV, TRUSTED_ENV

    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    monkeypatch.chdir(tmp_path)
    keygen = run("cache", "keygen", "ci.key")
    assert keygen.exit_code == 0, keygen.output
    public = keygen.stdout.strip()
    assert run("cache", "keygen", "ci.key").exit_code == 1  # never overwritten
    remote = tmp_path / "remote"
    url = remote.as_uri()

    def settings(name: str) -> onnxbuild.Settings:
        return onnxbuild.Settings(
            cache_dir=tmp_path / f"{name}-cache", artifacts_dir=tmp_path / f"{name}-artifacts", cache_url=url
        )

    # an attacker with write access pushes first, unsigned
    assert onnxbuild.build([LR], settings("attacker"), in_process=True).ok
    assert not list(remote.glob("entries/*/*.sig"))
    monkeypatch.setenv(TRUSTED_ENV, public)
    recorder = Recorder()
    reader = onnxbuild.build([LR], settings("reader"), in_process=True, reporter=recorder)
    assert [s["status"] for s in reader.recipes[0].steps] == ["built", "built"]
    assert sum("is not signed by a trusted key; building instead" in w for w in recorder.warnings) == 2
    # CI, holding the private key, pushes signed entries over the unsigned ones
    monkeypatch.setenv(SIGNING_ENV, str(tmp_path / "ci.key"))
    assert onnxbuild.build([LR], settings("ci"), in_process=True).ok
    # each entry and its signature are one object, replacing the unsigned one: a reader never
    # pairs one runner's entry with another's signature
    envelopes = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(remote.glob("entries/*/*.json"))]
    assert len(envelopes) == 2 and not list(remote.glob("entries/*/*.sig"))
    assert all(e["format"] == "onnxbuild-signed-entry/1" and e["signature"] for e in envelopes)
    monkeypatch.delenv(SIGNING_ENV)
    second = onnxbuild.build([LR], settings("reader2"), in_process=True)
    assert [s["status"] for s in second.recipes[0].steps] == ["cached", "cached"]
    # a changed entry (another consistent model) no longer matches its signature
    entry = sorted(remote.glob("entries/*/*.json"))[0]
    envelope = json.loads(entry.read_text(encoding="utf-8"))
    data = json.loads(envelope["entry"])
    data["data"]["summary"] = "tampered"
    envelope["entry"] = json.dumps(data, sort_keys=True, indent=2)
    entry.write_text(json.dumps(envelope, sort_keys=True, indent=2), encoding="utf-8")
    recorder = Recorder()
    third = onnxbuild.build([LR], settings("reader3"), in_process=True, reporter=recorder)
    assert third.ok and any("is not signed by a trusted key" in w for w in recorder.warnings)
    monkeypatch.setenv(TRUSTED_ENV, "not-a-key")
    bad = run("--cache-url", url, "--cache-dir", str(tmp_path / "r4"), "make", LR)
    assert (
        bad.exit_code == 1
        and "ONNXBUILD_CACHE_TRUSTED_KEYS: 'not-a-key' is not a base64 Ed25519 public key" in bad.stderr
    )


# ---------------------------------------------------------------- 9. smaller breaks


@pytest.mark.parametrize(
    ("arrange", "message"),
    [
        (
            lambda f: (f / "model.onnx").unlink() or (f / "model.onnx").mkdir(),
            "Error: artifacts/linear-regression/model.onnx is a folder where onnxbuild writes a file; move it "
            "away and build again\n",
        ),
        (
            lambda f: shutil.rmtree(f / "reports") or (f / "reports").write_text("mine", encoding="utf-8"),
            "Error: artifacts/linear-regression/reports is a file where onnxbuild needs a folder (for "
            "reports/check.json); move it away and build again\n",
        ),
        (
            lambda f: shutil.rmtree(f) or f.write_text("mine", encoding="utf-8"),
            "Error: artifacts/linear-regression is a file where onnxbuild writes the artifact folder; move it "
            "away and build again\n",
        ),
    ],
    ids=["model-is-a-folder", "reports-is-a-file", "folder-is-a-file"],
)
def test_something_in_the_way_in_the_artifact_folder_is_named_and_kept(
    project: Path, arrange: Callable[[Path], object], message: str
) -> None:
    assert run("make", LR).exit_code == 0
    folder = project / "artifacts" / "linear-regression"
    arrange(folder)
    result = run("make", LR)
    assert result.exit_code == 2
    assert result.stderr == message
    assert "Traceback" not in result.output


def test_plan_leaves_a_damaged_entry_where_it_is(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    entry = _entries(project)[0]
    entry.write_text("{", encoding="utf-8")
    assert run("plan", LR).exit_code == 1
    assert entry.read_text(encoding="utf-8") == "{"  # planning changes nothing
    assert run("make", LR).exit_code == 0
    assert entry.read_text(encoding="utf-8") != "{"


def test_files_onnxbuild_writes_are_readable_by_all(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    mask = os.umask(0)
    os.umask(mask)
    folder = project / "artifacts" / "linear-regression"
    for path in [folder / "manifest.json", folder / "timings.json", *_entries(project)]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_a_sequence_beyond_the_models_positions_is_a_recipe_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = (
        (ROOT / "tests" / "data" / "tiny-past.yaml")
        .read_text(encoding="utf-8")
        .replace("{batch: 1, sequence: 1, past_sequence: 40}", "{batch: 1, sequence: 100, past_sequence: 40}")
    )
    (tmp_path / "r.yaml").write_text(text, encoding="utf-8")
    result = run("plan", "r.yaml")
    assert result.exit_code == 2
    assert (
        "validate.shapes[2]: sequence + past_sequence is 140, beyond the model's 128 positions "
        "(source.huggingface.config); use at most 128" in result.stderr
    )


def test_a_non_ascii_recipe_path_under_the_c_locale(project: Path) -> None:
    folder = project / "réc"
    folder.mkdir()
    (folder / "lr-é.yaml").write_text((project / LR).read_text(encoding="utf-8"), encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "LANG": "C"}
    done = subprocess.run(
        [sys.executable, "-m", "onnxbuild", "make", "réc/lr-é.yaml"],
        cwd=project,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    manifest = json.loads((project / "artifacts" / "linear-regression" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["recipe"]["path"] == "réc/lr-é.yaml"


def test_sigterm_stops_the_build_and_its_step_processes(project: Path) -> None:
    """CI cancels and `docker stop` send SIGTERM to the build: its running step goes too."""
    import signal
    import time

    import psutil

    from onnxbuild.engine.execute import TEST_DELAY_ENV

    env = {**os.environ, TEST_DELAY_ENV: "check:60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "onnxbuild", "make", LR],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    steps: list[psutil.Process] = []
    while not steps:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
        log = list((cache_of(project) / "tmp").glob("*/step.log"))
        if log and "test hook: sleeping" in log[0].read_text(encoding="utf-8"):
            steps = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert b"Interrupted; nothing partial was kept" in err and b"Traceback" not in err
    _, alive = psutil.wait_procs(steps, timeout=10)
    assert alive == [], alive


def test_gc_removes_key_locks_nobody_holds(project: Path, settings: onnxbuild.Settings) -> None:
    assert onnxbuild.build([LR], settings, in_process=True).ok
    locks = cache_of(project) / "locks"
    stale = locks / ("key-" + "0" * 64 + ".lock")
    stale.write_text("", encoding="utf-8")
    held = Cache(cache_of(project)).lock("key-" + "1" * 64)
    held.acquire()
    try:
        assert run("gc").exit_code == 0
        assert not stale.exists() and held.path.exists()
    finally:
        held.release()


@pytest.mark.parametrize(
    ("errno", "strerror", "hint"),
    [
        (28, "No space left on device", "free some space or point --cache-dir/--artifacts-dir at a bigger disk"),
        (30, "Read-only file system", "the file system is read-only; pass a writable --cache-dir/--artifacts-dir"),
    ],
)
def test_a_full_or_read_only_disk_is_one_line_naming_the_file(
    monkeypatch: pytest.MonkeyPatch, errno: int, strerror: str, hint: str
) -> None:
    """A unit test of the CLI's last line of defence (no disk is filled here): an OSError
    from anywhere in a build becomes one Error line with the file and what to do."""
    from onnxbuild import api

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno, strerror, ".onnxbuild/cache/objects/ab/abc")

    monkeypatch.setattr(api, "build", full)
    result = run("make", LR)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {strerror} (.onnxbuild/cache/objects/ab/abc); {hint}\n"
