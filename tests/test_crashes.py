"""Builds SIGKILLed in the middle of a write: into the cache, and into artifacts/.

The engine's test hook ONNXBUILD_TEST_PAUSE="<point>:<detail>:<seconds>:<marker>" makes
``onnxbuild make`` create the marker file and sleep at a point of a write; the test waits
for the marker, kills the whole process group there, looks at what is left, then builds
again and compares every artifact with an uninterrupted build's. The points:

- ``cache-write:<step>``: in Cache.commit, the step's first output moved into objects/, the
  others still in the scratch folder, no entry written yet;
- ``materialise:<file>``: an artifact hard-linked under its temporary name
  ``.<file>.<pid>.tmp`` beside its place, not yet renamed over it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers_engine import entry_files, leftovers, read_json, scratch_dirs, whole_entries

import onnxbuild
from onnxbuild.engine.testhooks import TEST_PAUSE_ENV

ROOT = Path(__file__).resolve().parent.parent
LR = "recipes/linear-regression.yaml"
MAKE = [sys.executable, "-m", "onnxbuild", "make", LR]
LR_OUTPUTS = {"model.onnx", "reports/check.json", "reports/check.md"}
TIMED = {"timings.json", "report.html"}  # run facts: this run's statuses and times
"""Artifacts that hold durations and memory peaks, which differ from run to run by nature."""


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path, temporary names included."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def comparable_manifest(path: Path) -> dict[str, Any]:
    """The manifest, which holds no run facts: a step the killed build finished is "cached"
    in the rerun where the reference says "built" (timings.json says so), and the manifest
    is the same bytes all the same."""
    manifest: dict[str, Any] = read_json(path)
    assert all("status" not in step and "reason" not in step for step in manifest["steps"])
    return manifest


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/linear-regression/ of an uninterrupted build (shared: read, don't change)."""
    root = tmp_path_factory.mktemp("reference")
    shutil.copytree(ROOT / "recipes", root / "recipes")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv(TEST_PAUSE_ENV, raising=False)
        settings = onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts")
        report = onnxbuild.build([LR], settings)
        assert report.ok, report.failures()
    return root / "artifacts" / "linear-regression"


def _cache(project: Path) -> Path:
    return project / ".onnxbuild" / "cache"


def whole_objects(cache: Path) -> set[str]:
    """Names of the cache's objects, each checked to hold exactly the bytes its name is the digest of."""
    objects = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (cache / "objects").glob("*/*")}
    assert all(name == sha for name, sha in objects.items()), objects
    return set(objects)


def kill_at(point: str, detail: str, project: Path) -> None:
    """Run ``onnxbuild make`` until it pauses at ``point``, then SIGKILL its process group."""
    marker = project / "paused"
    log = project / "killed.log"
    env = {**os.environ, TEST_PAUSE_ENV: f"{point}:{detail}:60:{marker}"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            MAKE, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the build never reached the pause"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert marker.read_text().startswith(f"{point}:{detail}:")


def rebuild_and_compare(project: Path, reference: Path) -> None:
    """Build again without the hook: it must finish, clean up, and match the reference."""
    env = {k: v for k, v in os.environ.items() if k != TEST_PAUSE_ENV}
    rerun = subprocess.run(MAKE, cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert "waited" not in rerun.stderr  # the killed build's locks died with it
    folder = project / "artifacts" / "linear-regression"
    got, want = digests(folder), digests(reference)
    assert set(got) == set(want) == LR_OUTPUTS | TIMED | {"manifest.json"}
    for rel in LR_OUTPUTS:
        assert got[rel] == want[rel], rel
    assert comparable_manifest(folder / "manifest.json") == comparable_manifest(reference / "manifest.json")
    assert got["manifest.json"] == want["manifest.json"]  # byte-identical, as the README promises
    cache = _cache(project)
    assert leftovers(cache, project / "artifacts") == []
    assert scratch_dirs(cache) == []
    assert len(whole_entries(cache)) == len(entry_files(cache)) == 2
    assert whole_objects(cache) == {want[rel] for rel in LR_OUTPUTS}


@pytest.mark.parametrize(
    ("step", "stored", "unstored"),
    [("source", {"model.onnx"}, set()), ("check", {"model.onnx", "reports/check.json"}, {"reports/check.md"})],
)
def test_killed_while_writing_the_cache(
    project: Path, reference: Path, step: str, stored: set[str], unstored: set[str]
) -> None:
    kill_at("cache-write", step, project)

    cache = _cache(project)
    # Whole objects only; the step's entry is missing, so the step will simply run again.
    want = digests(reference)
    assert whole_objects(cache) == {want[rel] for rel in stored}
    assert [e["step"] for e in whole_entries(cache)] == ([] if step == "source" else ["source"])
    # The rest of the step's outputs are in the dead build's scratch folder, which is the
    # cache's place for unfinished work, and which the next build removes.
    [scratch] = scratch_dirs(cache)
    assert {p.relative_to(scratch / "out").as_posix() for p in (scratch / "out").rglob("*") if p.is_file()} == unstored
    assert leftovers(cache) == []
    assert not (project / "artifacts").exists()

    rebuild_and_compare(project, reference)
    statuses = {
        name: s["status"]
        for name, s in read_json(project / "artifacts" / "linear-regression" / "timings.json")["steps"].items()
    }
    assert statuses == {"source": "built" if step == "source" else "cached", "check": "built"}


@pytest.mark.parametrize(
    ("file", "before"), [("model.onnx", set()), ("reports/check.md", {"model.onnx", "reports/check.json"})]
)
def test_killed_while_materialising_artifacts(project: Path, reference: Path, file: str, before: set[str]) -> None:
    kill_at("materialise", file, project)

    folder = project / "artifacts" / "linear-regression"
    want = digests(reference)
    got = digests(folder)
    # What sits under its real name is whole (os.replace is the only way in); the file being
    # placed is a hard link under a hidden temporary name; no manifest yet, as it comes last.
    temporary = {rel for rel in got if Path(rel).name.startswith(".") and rel.endswith(".tmp")}
    [tmp] = temporary
    assert Path(tmp).parent == Path(file).parent and Path(tmp).name.startswith(f".{Path(file).name}.")
    assert got[tmp] == want[file]
    assert {rel: got[rel] for rel in set(got) - temporary} == {rel: want[rel] for rel in before}
    # Both steps were committed before materialising began.
    assert {e["step"] for e in whole_entries(_cache(project))} == {"source", "check"}

    rebuild_and_compare(project, reference)
    statuses = {name: s["status"] for name, s in read_json(folder / "timings.json")["steps"].items()}
    assert statuses == {"source": "cached", "check": "cached"}


def test_the_pause_hook_does_nothing_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from onnxbuild.engine.testhooks import pause_for_tests

    marker = tmp_path / "marker"
    monkeypatch.setenv(TEST_PAUSE_ENV, f"materialise:model.onnx:0:{marker}")
    pause_for_tests("cache-write", "model.onnx")
    pause_for_tests("materialise", "reports/check.md")
    assert not marker.exists()
    pause_for_tests("materialise", "model.onnx")
    assert marker.read_text().startswith("materialise:model.onnx:")


def test_killed_while_writing_the_manifest(project: Path, reference: Path) -> None:
    kill_at("manifest-write", "linear-regression", project)
    folder = project / "artifacts" / "linear-regression"
    assert [p.name for p in folder.glob(".manifest.json.*.tmp")], "the kill should leave the manifest's temporary file"
    rebuild_and_compare(project, reference)
    assert not list(folder.glob(".*.tmp"))


def signal_at(point: str, sig: signal.Signals, project: Path) -> tuple[int, str]:
    """Run ``onnxbuild make`` until it pauses at ``point``, send ``sig`` to it (as Ctrl-C or
    `docker stop` would), and return its exit code and what it wrote to stderr."""
    marker = project / "paused"
    marker.unlink(missing_ok=True)
    env = {**os.environ, TEST_PAUSE_ENV: f"{point}::5:{marker}"}
    proc = subprocess.Popen(
        MAKE, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never reached the pause"
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err.decode("utf-8", "replace")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_during_start_up_or_shut_down_is_an_exit_code_not_a_death(project: Path, sig: signal.Signals) -> None:
    """Before the command's modules have loaded, an interrupt ends it with 130 and the
    interrupt's message; once the command has finished, its result stands (0 here): the
    process never dies of the signal (a negative return code), and prints no traceback."""
    code, err = signal_at("startup", sig, project)
    assert (code, err) == (130, "Interrupted; nothing partial was kept (completed steps stay cached).\n")
    code, err = signal_at("exit", sig, project)
    assert code == 0 and "Traceback" not in err, err
    assert (project / "artifacts" / "linear-regression" / "model.onnx").is_file()


@pytest.mark.slow  # a build killed again and again until it finishes: make test-slow
def test_a_kill_loop_resumes_byte_identical_and_leaves_no_temp_files(project: Path, reference: Path) -> None:
    """21 builds, each stopped by a random signal (KILL to the whole group, TERM or INT to the
    build) at a random moment, some forced so there is always work to cut short; then one
    plain build must give the reference's bytes, manifest included, and no temporary file."""
    import random

    rng = random.Random(14)
    env = {k: v for k, v in os.environ.items() if k != TEST_PAUSE_ENV}
    outcomes: dict[str, int] = {}
    for i in range(21):
        sig = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)[i % 3]
        args = MAKE + (["--force"] if i % 2 else [])
        proc = subprocess.Popen(
            args, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        # From 0.3 s: before that the interpreter itself is starting, where no program can
        # catch a signal; the test above covers the moments right after.
        time.sleep(rng.uniform(0.3, 2.5))
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err.decode("utf-8", "replace"), err
        outcomes[signal.Signals(sig).name] = outcomes.get(signal.Signals(sig).name, 0) + 1
        if sig != signal.SIGKILL:
            assert proc.returncode in (0, 130), err  # finished before the signal, or stopped cleanly
    assert outcomes == {"SIGKILL": 7, "SIGTERM": 7, "SIGINT": 7}
    rebuild_and_compare(project, reference)
    cache = _cache(project)
    assert leftovers(cache, project / "artifacts") == []
    assert not [p for p in (project / ".onnxbuild").rglob("*.tmp")]
    assert scratch_dirs(cache) == []


def test_a_build_interrupted_while_it_starts_a_step_process_prints_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Unit test of the engine: Ctrl-C arrives just after the step process was spawned, before
    its task is written to it (CI's kill loop once hit that moment: the step process read a
    closed pipe and printed "EOFError: Ran out of input" into the build's output). The build
    is interrupted all the same, and the step process is stopped before it reads anything."""
    import multiprocessing.util

    from helpers_engine import fake, register_fake

    from onnxbuild.engine.execute import ChildStep, Task
    from onnxbuild.spec import StepContext

    real = multiprocessing.util.spawnv_passfds
    spawned: list[int] = []

    def interrupted(path: Any, args: Any, passfds: Any) -> int:
        pid = int(real(path, args, passfds))
        if "spawn_main" in " ".join(map(str, args)):  # the step process (not multiprocessing's resource tracker)
            spawned.append(pid)
            signal.raise_signal(signal.SIGINT)
        return pid

    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", interrupted)
    register_fake()
    ctx = StepContext(
        recipe_name="r",
        recipe_path="recipes/r.yaml",
        recipe_dir=tmp_path,
        input_dir=tmp_path,
        output_dir=tmp_path / "out",
    )
    with pytest.raises(KeyboardInterrupt):
        ChildStep(Task(fake("a"), ctx, str(tmp_path / "a.log")))
    assert spawned
    try:
        _, status = os.waitpid(spawned[0], 0)  # where the build left it running, it ends on its own
    except ChildProcessError:
        status = None  # the build stopped and reaped it
    err = capfd.readouterr().err
    assert "Traceback" not in err and "EOFError" not in err, err
    assert status is None, f"the step process was left to run (wait status {status})"
