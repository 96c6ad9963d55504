"""Several onnxbuild processes on one cache, and builds killed mid-step.

These run the real command (``python -m onnxbuild make``) in subprocesses. A build is
killed at a known moment with the engine's test hook: ONNXBUILD_TEST_STEP_DELAY="<kind>:<s>"
makes the step process log that it sleeps, then sleep, before a step of that kind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_engine import (
    Recorder,
    entry_files,
    leftovers,
    outcomes,
    read_json,
    scratch_dirs,
    sha256,
    whole_entries,
)

import onnxbuild
from onnxbuild.engine.locks import FileLock
from onnxbuild.errors import CacheError

LR = "recipes/linear-regression.yaml"
MAKE = [sys.executable, "-m", "onnxbuild", "make", LR]


@pytest.fixture
def reference_model(project: Path) -> str:
    """sha256 of model.onnx from an uninterrupted build with its own cache and artifacts."""
    settings = onnxbuild.Settings(cache_dir=project / "ref" / "cache", artifacts_dir=project / "ref" / "artifacts")
    assert onnxbuild.build([LR], settings, in_process=True).ok
    return sha256(project / "ref" / "artifacts" / "linear-regression" / "model.onnx")


def _cache(project: Path) -> Path:
    return project / ".onnxbuild" / "cache"


def test_two_builds_at_once_build_each_step_once(project: Path, reference_model: str) -> None:
    procs = [
        subprocess.Popen([*MAKE, "--json"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err

    reports = [json.loads(out)["recipes"][0]["steps"] for out, _ in results]
    for name in ("source", "check"):
        steps = sorted((s for r in reports for s in r if s["name"] == name), key=lambda s: s["status"])
        assert [s["status"] for s in steps] == ["built", "cached"], steps
        # The later build found it in the cache, planned that way or found while waiting.
        assert steps[1]["reason"] in ("up to date", "built meanwhile by another onnxbuild"), steps[1]
    assert sha256(project / "artifacts" / "linear-regression" / "model.onnx") == reference_model
    assert len(whole_entries(_cache(project))) == 2
    assert len(list((_cache(project) / "objects").rglob("*/*"))) == 3  # model.onnx, check.json, check.md
    assert scratch_dirs(_cache(project)) == []
    assert leftovers(_cache(project), project / "artifacts") == []


def _start_and_kill_during(kind: str, project: Path, log: Path) -> None:
    """Run ``onnxbuild make``, SIGKILL its whole process group while a ``kind`` step runs."""
    env = {**os.environ, "ONNXBUILD_TEST_STEP_DELAY": f"{kind}:60"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            MAKE, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while not any("test hook: sleeping" in p.read_text() for p in (_cache(project) / "tmp").glob("*/step.log")):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["source", "check"])
def test_build_killed_mid_step_leaves_nothing_partial(project: Path, reference_model: str, kind: str) -> None:
    cache = _cache(project)
    _start_and_kill_during(kind, project, project / "killed.log")

    # What the kill left: the running step's scratch folder, and only whole entries.
    assert len(scratch_dirs(cache)) == 1
    assert [e["step"] for e in whole_entries(cache)] == ([] if kind == "source" else ["source"])
    assert not (project / "artifacts" / "linear-regression").exists()

    rerun = subprocess.run(MAKE, cwd=project, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert "waited" not in rerun.stderr  # the dead build's locks went with it
    timings = read_json(project / "artifacts" / "linear-regression" / "timings.json")
    assert {name: s["status"] for name, s in timings["steps"].items()} == {
        "source": "built" if kind == "source" else "cached",
        "check": "built",
    }
    assert sha256(project / "artifacts" / "linear-regression" / "model.onnx") == reference_model
    assert scratch_dirs(cache) == []
    assert leftovers(cache, project / "artifacts") == []
    assert len(whole_entries(cache)) == len(entry_files(cache)) == 2


def test_a_killed_build_takes_its_forked_steps_with_it(project: Path) -> None:
    """A step forked from the build's warm process dies with the build, as a spawned one does:
    SIGKILL the build alone (not its process group) while its machine step sleeps."""
    recipe = project / "recipes" / "linear-regression.yaml"
    recipe.write_text(recipe.read_text(encoding="utf-8") + "benchmark: {iterations: 2}\n", encoding="utf-8")
    env = {**os.environ, "ONNXBUILD_TEST_STEP_DELAY": "machine:60"}
    proc = subprocess.Popen(
        MAKE, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    step = None
    try:
        deadline = time.monotonic() + 90
        while step is None:
            logs = [p.read_text() for p in (_cache(project) / "tmp").glob("*/step.log")]
            said = [line for text in logs for line in text.splitlines() if "test hook: sleeping" in line]
            if said:
                step = int(said[0].rsplit("(pid ", 1)[1].rstrip(")"))
            assert proc.poll() is None and time.monotonic() < deadline, "the machine step never started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the build alone: its steps are in groups of their own
        proc.communicate(timeout=30)  # the build's output closes: nothing of it lingers holding it
        deadline = time.monotonic() + 30
        while _alive(step):
            assert time.monotonic() < deadline, "the forked step outlived its build"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        if step is not None and _alive(step):
            os.kill(step, signal.SIGKILL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HOLD = """
import sys, time
from pathlib import Path
from onnxbuild.engine.locks import FileLock
lock = FileLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_lock_of_a_killed_process_is_reclaimed(settings: onnxbuild.Settings) -> None:
    path = settings.cache_dir / "locks" / "recipe-linear-regression.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        probe = FileLock(path, what="recipe linear-regression", timeout=0.2)
        assert not probe.try_acquire()
        with pytest.raises(
            CacheError,
            match=r"^timed out after 0s waiting for the lock on recipe linear-regression "
            r"\(.*recipe-linear-regression\.lock\); another onnxbuild is still running$",
        ):
            probe.acquire()
    finally:
        holder.kill()
        holder.communicate()
    assert holder.returncode == -signal.SIGKILL
    assert path.exists()  # the lock file stays; the lock does not

    recorder = Recorder()
    report = onnxbuild.build([LR], settings, in_process=True, reporter=recorder)
    assert report.ok
    assert recorder.warnings == []  # no "waited ... for another onnxbuild"
    assert outcomes(report)["linear-regression:check"][0] == "built"


def test_four_builds_of_three_recipes_on_one_cache_build_each_key_once(project: Path, reference_model: str) -> None:
    # Two builds of linear-regression; a twin under another name, whose steps have the very
    # same keys (a key is what goes into a step, not which recipe asks); and a recipe with
    # other weights, which shares nothing. All four start at once on one cache.
    text = (project / LR).read_text(encoding="utf-8")
    (project / "recipes" / "lr-twin.yaml").write_text(
        text.replace("name: linear-regression", "name: lr-twin"), encoding="utf-8"
    )
    assert "random: {seed: 0," in text
    other = text.replace("name: linear-regression", "name: lr-other").replace("random: {seed: 0,", "random: {seed: 1,")
    (project / "recipes" / "lr-other.yaml").write_text(other, encoding="utf-8")
    recipes = [LR, LR, "recipes/lr-twin.yaml", "recipes/lr-other.yaml"]
    make = [sys.executable, "-m", "onnxbuild", "make", "--json"]
    procs = [
        subprocess.Popen([*make, r], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in recipes
    ]
    results = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err

    steps = [s for out, _ in results for s in json.loads(out)["recipes"][0]["steps"]]
    builds: dict[str, int] = {}
    for s in steps:
        builds[s["key"]] = builds.get(s["key"], 0) + (s["status"] == "built")
    assert len(builds) == 4  # source and check of linear-regression (and its twin), and of lr-other
    assert sorted(builds.values()) == [1, 1, 1, 1], steps  # each key built by exactly one process
    assert sorted(s["status"] for s in steps) == ["built"] * 4 + ["cached"] * 4
    assert {s["reason"] for s in steps if s["status"] == "cached"} <= {
        "up to date",
        "built meanwhile by another onnxbuild",
    }

    for name in ("linear-regression", "lr-twin"):
        assert sha256(project / "artifacts" / name / "model.onnx") == reference_model
    assert sha256(project / "artifacts" / "lr-other" / "model.onnx") != reference_model
    assert len(whole_entries(_cache(project))) == 4
    assert scratch_dirs(_cache(project)) == []
    assert leftovers(_cache(project), project / "artifacts") == []
    verify = subprocess.run(
        [sys.executable, "-m", "onnxbuild", "cache", "verify"], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout == "checked 4 cache entries; dropped 0\n"
