"""A build on a two-node Ray cluster started here (``ray.cluster_utils.Cluster``; the head
has no CPUs, so every step runs on a node), the way #40 asks a cluster build to behave:

- the steps spread over both nodes, each node pulls what it uses through its own cache
  (``ONNXBUILD_CACHE_DIR`` in that node's environment) and keeps what it made there;
- no worker opens a path under the driver's project, cache or artifacts (an audit hook,
  installed in every worker by Ray's ``worker_process_setup_hook``, writes down any);
- the artifacts equal a local build's;
- the steps whose key names this machine (machine, benchmark) run only on the node with
  this machine's CPU (the other node's workers report another CPU fingerprint), and a
  cluster with no such node is refused before anything runs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_artifacts import digests

import onnxbuild
from onnxbuild import environment
from onnxbuild.engine.cluster import RayExecutor, RaySettings
from onnxbuild.engine.runner import BuildReport
from onnxbuild.engine.testhooks import TEST_PAUSE_ENV
from onnxbuild.errors import UsageError

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DELAY_ENV = "ONNXBUILD_TEST_STEP_DELAY"
KILLED = "quantize: [{name: killme, method: dynamic}]\n"

HOOK = '''
import os
import sys


def install():
    """Run in every worker at start: another CPU where the node says so, and the audit hook."""
    fake = os.environ.get("OB_FAKE_CPU")
    if fake:
        from onnxbuild import environment

        environment.cpu_fingerprint = lambda: fake
    forbidden = tuple(p for p in os.environ.get("OB_FORBIDDEN", "").split(os.pathsep) if p)
    log = os.environ["OB_AUDIT_LOG"]

    def audit(event, args):
        if event != "open" or not args or isinstance(args[0], int):
            return
        try:
            path = os.path.abspath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if path.startswith(forbidden):
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {path}\\n")

    sys.addaudithook(audit)
'''


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("cluster")
    (base / "hooks").mkdir()
    (base / "hooks" / "ob_audit.py").write_text(HOOK, encoding="utf-8")
    (base / "check-slept").touch()  # the kill test arms the delay by removing it
    common = {
        "PYTHONPATH": str(base / "hooks"),
        "OB_FORBIDDEN": str(base / "project") + os.sep,
        "OB_AUDIT_LOG": str(base / "audit.log"),
        # the kill test's hooks: a check step's first attempt sleeps; quantize.killme pauses
        # after its first push (each attempt: the kill test's recipe alone has that step)
        DELAY_ENV: f"check:60:{base / 'check-slept'}",
        TEST_PAUSE_ENV: f"push:quantize.killme:10:{base / 'pushed'}",
    }
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "env_vars": common}
    )
    cluster.add_node(num_cpus=2, env_vars={**common, "ONNXBUILD_CACHE_DIR": str(base / "node-a")})
    cluster.add_node(
        num_cpus=2, env_vars={**common, "ONNXBUILD_CACHE_DIR": str(base / "node-b"), "OB_FAKE_CPU": "another-cpu"}
    )
    ray.init(
        address=cluster.address,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"worker_process_setup_hook": "ob_audit.install"},
    )
    try:
        yield base
    finally:
        ray.shutdown()
        cluster.shutdown()


def project(root: Path, more: str = "benchmark: {iterations: 2}\n") -> Path:
    (root / "recipes").mkdir(parents=True)
    text = (ROOT / "recipes" / "linear-regression.yaml").read_text(encoding="utf-8")
    (root / "recipes" / "linear-regression.yaml").write_text(text + more, encoding="utf-8")
    return root


def build(root: Path, **extra: object) -> BuildReport:
    """Build the project's recipe from its folder (the manifest names the recipe as given)."""
    settings = onnxbuild.Settings(
        cache_dir=root / "cache",
        artifacts_dir=root / "artifacts",
        cache_url=extra.pop("cache_url", None),  # type: ignore[arg-type]
    )
    here = Path.cwd()
    os.chdir(root)
    try:
        return onnxbuild.build(["recipes/linear-regression.yaml"], settings, **extra)  # type: ignore[arg-type]
    finally:
        os.chdir(here)


@ray.remote(num_cpus=1)  # on a node (the head has no CPUs)
def _opens(path: str) -> None:
    try:
        open(path).close()
    except OSError:
        pass


def objects(cache: Path) -> set[str]:
    return {p.name for p in (cache / "objects").glob("*/*") if p.is_file()}


def test_a_build_on_two_nodes_spreads_keeps_to_their_disks_and_places_measured_steps_by_cpu(
    nodes: Path, tmp_path: Path
) -> None:
    # the hooks are live in every worker: node b reports another CPU, and an open is written down
    address = ray.get_runtime_context().gcs_address
    found = RayExecutor(RaySettings(address=address, remote_url=(nodes / "remote").as_uri())).identities()
    assert sorted(fp for _, fp, _ in found.values()) == sorted([environment.cpu_fingerprint(), "another-cpu"])
    ray.get(_opens.remote(str(nodes / "project" / "probe")))
    assert (nodes / "audit.log").read_text(encoding="utf-8").strip().endswith("/project/probe")
    (nodes / "audit.log").unlink()

    local = project(tmp_path / "local")
    assert build(local, in_process=True).ok
    root = project(nodes / "project")
    report = build(root, cache_url=(nodes / "remote").as_uri(), executor="ray", ray_address=address)
    assert report.ok, report.failures()
    assert digests(root / "artifacts") == digests(local / "artifacts")
    audit = nodes / "audit.log"
    assert not audit.exists(), f"workers opened the driver's files: {audit.read_text(encoding='utf-8')[:2000]}"
    a, b = objects(nodes / "node-a"), objects(nodes / "node-b")
    assert a and b, f"a node ran nothing: node-a holds {len(a)} objects, node-b {len(b)}"
    for cache in (nodes / "node-a", nodes / "node-b"):  # what each node holds is what it pulled or made, whole
        for path in (cache / "objects").glob("*/*"):
            assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    manifest = json.loads((root / "artifacts" / "linear-regression" / "manifest.json").read_text(encoding="utf-8"))
    measured = {o["sha256"] for s in manifest["steps"] if s["kind"] in ("machine", "benchmark") for o in s["outputs"]}
    assert measured and measured <= a, "the machine and benchmark steps ran on the node with this machine's CPU"
    assert not measured & b, "a measured step ran on the node whose CPU differs from its key's"


def test_a_cluster_with_no_node_of_this_cpu_is_refused_before_anything_runs(
    nodes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "cpu_fingerprint", lambda: "the-planning-machine")
    root = project(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match=r"benchmark.* measure the machine their key names.*no node of the Ray"):
        build(
            root,
            cache_url=(tmp_path / "remote").as_uri(),
            executor="ray",
            ray_address=ray.get_runtime_context().gcs_address,
        )
    assert not list((root / "cache").glob("entries/*/*.json"))
    assert not (tmp_path / "remote" / "objects").exists()


def test_a_worker_killed_before_and_after_its_first_push_runs_again_to_the_same_artifacts(
    nodes: Path, tmp_path: Path
) -> None:
    """SIGKILL the worker of the check step while it runs (nothing pushed yet) and the worker of
    quantize.killme once it has pushed its first output: Ray runs each again on a fresh worker,
    the build succeeds with the local build's artifacts, and the report counts 2 attempts each."""
    local = project(tmp_path / "local", KILLED)
    assert build(local, in_process=True).ok
    root = project(nodes / "killed", KILLED)
    address = ray.get_runtime_context().gcs_address
    (nodes / "check-slept").unlink()  # arm: the first check attempt sleeps, a retry does not
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["report"] = build(
                root, cache_url=(nodes / "remote-killed").as_uri(), executor="ray", ray_address=address
            )
        except BaseException as exc:  # handed to the test thread
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        sleeping = _wait_for(lambda: _sleeping_pid(nodes), "the check step to start")
        os.kill(sleeping, signal.SIGKILL)
        pushed = nodes / "pushed"
        pid = _wait_for(lambda: int(pushed.read_text().split(":")[2]) if pushed.exists() else None, "a first push")
        os.kill(pid, signal.SIGKILL)
    finally:
        thread.join(timeout=240)
    assert "error" not in result, result.get("error")
    report = result["report"]
    assert isinstance(report, BuildReport) and report.ok, report
    assert digests(root / "artifacts") == digests(local / "artifacts")
    attempts = {s["name"]: s.get("attempts", 1) for r in report.recipes for s in r.steps}
    assert attempts["check"] == 2 and attempts["quantize.killme"] == 2, attempts


def _sleeping_pid(nodes: Path) -> int | None:
    for log in [*(nodes / "node-a" / "tmp").glob("*/step.log"), *(nodes / "node-b" / "tmp").glob("*/step.log")]:
        text = log.read_text(encoding="utf-8", errors="replace")
        if "test hook: sleeping" in text:
            return int(text.split("(pid ")[1].split(")")[0])
    return None


def _wait_for(found: object, what: str) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        value = found()  # type: ignore[operator]
        if value is not None:
            return int(value)
        time.sleep(0.1)
    raise AssertionError(f"waited 120 s for {what}")
