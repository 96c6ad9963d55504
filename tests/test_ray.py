"""The Ray executor on a local Ray instance: same artifacts and manifests as the local
executor, each key built once, a killed worker's step retried, steps no node can run
refused before anything runs, and the remote-cache path a multi-node cluster uses."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_artifacts import digests

import onnxbuild
from onnxbuild.errors import UsageError

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
RECIPES = ["linear-regression.yaml", "tiny-gpt2.yaml", "digits-mlp.yaml"]
DELAY_ENV = "ONNXBUILD_TEST_STEP_DELAY"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One local Ray instance for the module. Its workers inherit the environment of this
    moment, so the kill test's one-shot delay hook is armed here, for check steps (a
    kind every recipe has); its marker file exists except while the kill test runs."""
    marker = tmp_path_factory.mktemp("hook") / "slept-once"
    os.environ[DELAY_ENV] = f"check:60:{marker}"
    # a remote-cache task keeps what it pulls in its node's cache: here, not in ~/.cache
    before = os.environ.get("ONNXBUILD_CACHE_DIR")
    os.environ["ONNXBUILD_CACHE_DIR"] = str(tmp_path_factory.mktemp("node-cache"))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        del os.environ[DELAY_ENV]
        if before is None:
            del os.environ["ONNXBUILD_CACHE_DIR"]
        else:
            os.environ["ONNXBUILD_CACHE_DIR"] = before
    # The other tests must not trip the hook: create the marker, and let the kill test remove it.
    marker.touch()
    yield marker
    ray.shutdown()


def project(root: Path) -> Path:
    (root / "recipes").mkdir(parents=True)
    for name in RECIPES:
        shutil.copy(ROOT / "recipes" / name, root / "recipes" / name)
    shutil.copy(ROOT / "recipes" / "digits_mlp.py", root / "recipes" / "digits_mlp.py")
    return root


def settings(root: Path, **extra: object) -> onnxbuild.Settings:
    return onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts", **extra)  # type: ignore[arg-type]


def recipes_in(root: Path) -> list[Path]:
    return [root / "recipes" / n for n in RECIPES]


def build_in(root: Path, recipes: list[Path], **kwargs: object) -> onnxbuild.BuildReport:
    """Build from inside ``root`` with relative paths, as a user would: manifests name the
    recipe by the path given, so two projects' manifests compare byte for byte."""
    here = Path.cwd()
    os.chdir(root)
    try:
        return onnxbuild.build(
            [p.relative_to(root) for p in recipes], settings(root, **kwargs.pop("extra", {})), **kwargs
        )  # type: ignore[arg-type]
    finally:
        os.chdir(here)


@pytest.mark.slow  # starts a Ray instance and builds through it: make test-slow
def test_ray_builds_the_same_artifacts_and_manifests_as_the_local_executor(cluster: Path, tmp_path: Path) -> None:
    local, remote = project(tmp_path / "local"), project(tmp_path / "ray")
    assert build_in(local, recipes_in(local), jobs=2).ok
    report = build_in(remote, recipes_in(remote), executor="ray")
    assert report.ok, report.failures()
    assert digests(remote / "artifacts") == digests(local / "artifacts")
    # Each key built once: every step record is "built" exactly once per key.
    keys = [s["key"] for r in report.recipes for s in r.steps if s["status"] == "built"]
    assert len(keys) == len(set(keys)) and len(keys) == sum(len(r.steps) for r in report.recipes)
    again = build_in(remote, recipes_in(remote), executor="ray")
    assert {s["status"] for r in again.recipes for s in r.steps} == {"cached"}


def test_a_worker_killed_mid_step_is_retried_to_the_same_result(cluster: Path, tmp_path: Path) -> None:
    ref = project(tmp_path / "ref")
    assert build_in(ref, [ref / "recipes" / "linear-regression.yaml"], in_process=True).ok
    work = project(tmp_path / "work")
    cluster.unlink()  # arm the one-shot hook: the first check attempt sleeps, a retry does not
    result: dict[str, object] = {}

    def build() -> None:
        try:
            result["report"] = onnxbuild.build(["recipes/linear-regression.yaml"], settings(work), executor="ray")
        except BaseException as exc:  # handed to the test thread
            result["error"] = exc

    thread = threading.Thread(target=build)
    os.chdir(work)  # the build thread names the recipe relative to the project, as the reference did
    thread.start()
    pid = None
    deadline = time.monotonic() + 120
    while pid is None:
        assert time.monotonic() < deadline, "the check step never started"
        for log in (work / "cache" / "tmp").glob("*/step.log"):
            text = log.read_text()
            if "test hook: sleeping" in text:
                pid = int(text.split("(pid ")[1].split(")")[0])
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=180)
    os.chdir(ROOT)
    assert "error" not in result, result.get("error")
    report = result["report"]
    assert report.ok, report.failures()  # type: ignore[attr-defined]
    assert digests(work / "artifacts") == digests(ref / "artifacts")


def test_a_step_that_needs_a_gpu_is_refused_before_anything_runs(cluster: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "gpu")
    recipe = root / "recipes" / "cuda.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "linear-regression.yaml").read_text(encoding="utf-8")
        + "benchmark: {iterations: 2}\nproviders:\n  - {name: CUDAExecutionProvider}\n"
        "  - {name: CPUExecutionProvider}\n",
        encoding="utf-8",
    )
    with pytest.raises(
        UsageError,
        match=r"benchmark needs 1 GPU \(benchmark on CUDAExecutionProvider\) but no node of the Ray cluster has one",
    ):
        onnxbuild.build([recipe], settings(root), executor="ray")
    assert not (root / "artifacts" / "linear-regression" / "manifest.json").exists()
    assert not list((root / "cache").glob("entries/*/*.json"))


def test_a_cluster_by_address_needs_the_remote_cache(cluster: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "addr")
    with pytest.raises(
        UsageError,
        match=r"steps on other nodes exchange inputs and outputs through the remote cache, and none is configured",
    ):
        onnxbuild.build(recipes_in(root)[:1], settings(root), executor="ray", ray_address="ray://head:10001")


@pytest.mark.slow  # starts a Ray instance and builds through it: make test-slow
def test_through_the_remote_cache_steps_read_nothing_of_this_machine_but_digests(cluster: Path, tmp_path: Path) -> None:
    """The multi-node path, on this machine: inputs pulled and outputs pushed by digest."""
    local = project(tmp_path / "local")
    first = build_in(local, recipes_in(local)[:2])
    assert first.ok, [s["reason"] for _, s in first.failures()]
    root = project(tmp_path / "nodes")
    remote = (tmp_path / "remote").as_uri()
    report = build_in(root, recipes_in(root)[:2], extra={"cache_url": remote}, executor="ray", ray_address="auto")
    assert report.ok, report.failures()
    assert digests(root / "artifacts") == digests(local / "artifacts")
    pushed = list((tmp_path / "remote" / "objects").rglob("*/*"))
    assert len(pushed) >= sum(len(s["outputs"]) for r in report.recipes for s in r.steps) // 2


def test_without_ray_installed_the_message_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name: str, *args: object, **kwargs: object) -> object:
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_ray)
    from onnxbuild.engine.cluster import RayExecutor, RaySettings

    with pytest.raises(UsageError, match=r"--executor ray needs Ray: pip install 'onnxbuild\[ray\]'"):
        RayExecutor(RaySettings())
