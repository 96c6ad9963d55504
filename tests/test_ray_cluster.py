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
from collections.abc import Iterator
from pathlib import Path

import pytest

import onnxbuild
from onnxbuild import environment
from onnxbuild.engine.executors import RayExecutor, RaySettings
from onnxbuild.engine.runner import BuildReport
from onnxbuild.errors import UsageError

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MEASURED = {"timings.json", "report.html", "benchmark.json", "benchmark.md", "benchmark.png", "machine.json"}

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
    common = {
        "PYTHONPATH": str(base / "hooks"),
        "OB_FORBIDDEN": str(base / "project") + os.sep,
        "OB_AUDIT_LOG": str(base / "audit.log"),
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


def project(root: Path) -> Path:
    (root / "recipes").mkdir(parents=True)
    text = (ROOT / "recipes" / "linear-regression.yaml").read_text(encoding="utf-8")
    (root / "recipes" / "linear-regression.yaml").write_text(text + "benchmark: {iterations: 2}\n", encoding="utf-8")
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


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every artifact but the measured ones; manifests without the measured steps' figures."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name in MEASURED:
            continue
        data = p.read_bytes()
        if p.name == "manifest.json":
            manifest = json.loads(data)
            for step in manifest["steps"]:
                if step["kind"] in ("benchmark", "machine"):
                    step["outputs"] = [o["path"] for o in step["outputs"]]
                    step["data"] = {}
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return out


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
