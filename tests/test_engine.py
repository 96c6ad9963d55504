"""Planning and running: what reruns and why, parallelism, failures, and stable manifests.

Builds of the real linear-regression recipe run in-process (``in_process=True``) where the
test is about decisions, not processes; fake steps (``helpers_engine``) test the runner's
scheduling, and some of them run in real spawned step processes.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
from helpers_engine import (
    Recorder,
    built,
    fake,
    leftovers,
    outcomes,
    plan_fakes,
    read_json,
    reasons,
    register_fake,
    scratch_dirs,
    sha256,
    step_data,
    whole_entries,
)

import onnxbuild
import onnxbuild.engine.runner as runner
from onnxbuild.engine.cache import Cache, step_key
from onnxbuild.engine.locks import FileLock
from onnxbuild.engine.runner import execute, raise_for_failures
from onnxbuild.environment import package_version
from onnxbuild.errors import BuildFailed
from onnxbuild.steps import StepContext, StepKind, StepResult, StepSpec, register

LR = "recipes/linear-regression.yaml"
SOURCE = "linear-regression:source"
CHECK = "linear-regression:check"


def _edit(project: Path, old: str, new: str) -> None:
    path = project / LR
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def _model(settings: onnxbuild.Settings) -> Path:
    return settings.artifacts_dir / "linear-regression" / "model.onnx"


# ---------------------------------------------------------------- invalidation, real recipe


def test_changed_seed_reruns_the_step_and_its_dependents_and_says_why(
    project: Path, settings: onnxbuild.Settings
) -> None:
    onnxbuild.build([LR], settings, in_process=True)
    before = sha256(_model(settings))
    _edit(project, "seed: 0", "seed: 1")

    assert reasons(onnxbuild.plan([LR], settings)) == {
        SOURCE: ("run", ("source.graph.initializers[0].random.seed changed 0 -> 1",)),
        CHECK: ("run", ("only if its input from source changes",)),
    }
    report = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(report) == {
        SOURCE: ("built", "source.graph.initializers[0].random.seed changed 0 -> 1"),
        CHECK: ("built", "its input from source changed"),
    }
    assert sha256(_model(settings)) != before

    again = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(again) == {SOURCE: ("cached", "up to date"), CHECK: ("cached", "up to date")}


def test_description_is_in_no_key_so_nothing_reruns(project: Path, settings: onnxbuild.Settings) -> None:
    onnxbuild.build([LR], settings, in_process=True)
    _edit(project, "description: Linear regression", "description: A linear regression")

    assert reasons(onnxbuild.plan([LR], settings)) == {
        SOURCE: ("cached", ("up to date",)),
        CHECK: ("cached", ("up to date",)),
    }
    report = onnxbuild.build([LR], settings, in_process=True)
    assert built(report) == set()
    manifest = read_json(settings.artifacts_dir / "linear-regression" / "manifest.json")
    assert manifest["recipe"]["resolved"]["description"].startswith(
        "A linear regression"
    )  # the manifest does follow the recipe


def test_identical_bytes_upstream_leave_the_dependent_cached(project: Path, settings: onnxbuild.Settings) -> None:
    """Naming a node with the name it gets by default changes source's key, not model.onnx."""
    onnxbuild.build([LR], settings, in_process=True)
    before = sha256(_model(settings))
    _edit(project, "{op_type: MatMul, ", "{name: MatMul_0, op_type: MatMul, ")

    assert reasons(onnxbuild.plan([LR], settings)) == {
        SOURCE: ("run", ('source.graph.nodes[0].name added ("MatMul_0")',)),
        CHECK: ("run", ("only if its input from source changes",)),
    }
    report = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(report) == {
        SOURCE: ("built", 'source.graph.nodes[0].name added ("MatMul_0")'),
        CHECK: ("cached", "inputs were rebuilt identical"),
    }
    assert sha256(_model(settings)) == before

    # The next real change is still explained (check's last-build record kept its ingredients).
    _edit(project, "seed: 0", "seed: 7")
    report = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(report) == {
        SOURCE: ("built", "source.graph.initializers[0].random.seed changed 0 -> 7"),
        CHECK: ("built", "its input from source changed"),
    }


def test_package_upgrade_is_explained(settings: onnxbuild.Settings) -> None:
    """As if the last build ran with onnx 1.0.0: its record says so, and its entries are gone."""
    onnxbuild.build([LR], settings, in_process=True)
    now = package_version("onnx")
    cache = Cache(settings.cache_dir)
    last_path = settings.cache_dir / "last" / "linear-regression.json"
    last = read_json(last_path)
    for record in last.values():
        cache.discard(record["key"])
        record["ingredients"]["packages"]["onnx"] = "1.0.0"
        record["key"] = step_key(record["ingredients"])
    last_path.write_text(json.dumps(last), encoding="utf-8")

    assert reasons(onnxbuild.plan([LR], settings)) == {
        SOURCE: ("run", (f"onnx changed 1.0.0 -> {now}",)),
        # check's own key holds the onnx version too: said before its input is known
        CHECK: ("run", (f"onnx changed 1.0.0 -> {now}", "only if its input from source changes")),
    }
    report = onnxbuild.build([LR], settings, in_process=True)
    assert outcomes(report) == {
        SOURCE: ("built", f"onnx changed 1.0.0 -> {now}"),
        CHECK: ("built", f"onnx changed 1.0.0 -> {now}"),
    }


def test_force_reruns_every_selected_step(settings: onnxbuild.Settings) -> None:
    onnxbuild.build([LR], settings, in_process=True)
    forced = ("run", ("forced (--force)",))
    assert reasons(onnxbuild.plan([LR], settings, force=True)) == {SOURCE: forced, CHECK: forced}
    report = onnxbuild.build([LR], settings, in_process=True, force=True)
    assert outcomes(report) == {SOURCE: ("built", "forced (--force)"), CHECK: ("built", "forced (--force)")}
    report = onnxbuild.build([LR], settings, in_process=True, force=True, target="source")
    # check lies beyond the target: kept, since the forced source came out identical
    assert outcomes(report) == {
        SOURCE: ("built", "forced (--force)"),
        CHECK: ("cached", "inputs were rebuilt identical"),
    }


# ---------------------------------------------------------------- manifest


def test_two_clean_builds_write_identical_manifests(project: Path) -> None:
    """One built in step processes, one in-process, each with a fresh cache: same bytes."""
    first = onnxbuild.Settings(cache_dir=project / "cache-1", artifacts_dir=project / "artifacts")
    second = onnxbuild.Settings(cache_dir=project / "cache-2", artifacts_dir=project / "artifacts")
    folder = project / "artifacts" / "linear-regression"

    assert onnxbuild.build([LR], first).ok
    manifest = (folder / "manifest.json").read_bytes()
    timings = read_json(folder / "timings.json")
    onnxbuild.clean([LR], first)
    assert not folder.exists()
    assert onnxbuild.build([LR], second, in_process=True).ok

    assert (folder / "manifest.json").read_bytes() == manifest
    assert set(timings["steps"]) == {"source", "check"}
    assert all(
        set(t) == {"status", "reason", "seconds", "build_seconds", "peak_rss_mb"} for t in timings["steps"].values()
    )
    data = json.loads(manifest)
    # Durations and memory live in timings.json only (the recipe's own limits.seconds may appear).
    assert "peak_rss_mb" not in manifest.decode("utf-8")
    assert all(not {"seconds", "peak_rss_mb"} & set(s) for s in data["steps"])
    assert data["recipe"]["path"] == LR
    assert [s["name"] for s in data["steps"]] == ["source", "check"]
    assert {n: t["status"] for n, t in timings["steps"].items()} == {"source": "built", "check": "built"}
    assert sorted(o["path"] for s in data["steps"] for o in s["outputs"]) == [
        "model.onnx",
        "reports/check.json",
        "reports/check.md",
    ]


# ---------------------------------------------------------------- the runner, with fake steps


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    register_fake()
    monkeypatch.setattr(runner, "LOCK_TIMEOUT_S", 20.0)  # a deadlock fails the test rather than hanging it
    return Cache(tmp_path / "cache")


def test_jobs_2_runs_independent_steps_at_once(cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real multi-process run: a and b overlap in two step processes; c waits for both."""
    plan = plan_fakes(monkeypatch, cache, {"r": [fake("a", sleep=1.0), fake("b", sleep=1.0), fake("c", "a", "b")]})
    report = execute(plan, cache, tmp_path / "artifacts", jobs=2)

    assert report.ok
    a, b, c = (step_data(report, f"r:{n}") for n in "abc")
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])
    assert c["start"] >= max(a["end"], b["end"])
    assert len({a["pid"], b["pid"], c["pid"]}) == 3  # a fresh process per step
    assert (tmp_path / "artifacts" / "r" / "c.txt").read_text() == "c\na\n\nb\n\n"
    assert scratch_dirs(cache.root) == []


def test_steps_needing_torch_fork_from_one_warm_process_per_build_with_the_builds_environment(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step importing torch first forks from the build's warm process (torch already imported, so
    it starts in milliseconds rather than seconds); a light step is spawned fresh. Each sees the
    environment of its build, and no warm process outlives the build."""
    from multiprocessing import forkserver

    graphs = {"r": [fake("a", imports=("torch",)), fake("b", "a", imports=("torch",)), fake("c", "b")]}
    for mark in ("first", "second"):
        monkeypatch.setenv("ONNXBUILD_TEST_MARK", mark)
        report = execute(plan_fakes(monkeypatch, cache, graphs, force=True), cache, tmp_path / "artifacts", jobs=1)
        assert report.ok
        a, b, c = (step_data(report, f"r:{n}") for n in "abc")
        assert a["torch"] and b["torch"] and a["ppid"] == b["ppid"] != os.getpid()
        assert not c["torch"] and c["ppid"] == os.getpid()
        assert a["mark"] == b["mark"] == c["mark"] == mark
        assert forkserver._forkserver._forkserver_pid is None  # stopped with the build


def test_a_warm_process_that_dies_importing_leaves_the_build_to_spawned_steps(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import that raises more than ImportError (a broken install) kills the fork server while
    it starts; the build goes on with spawned steps instead of failing with its EOFError."""
    from multiprocessing import forkserver

    (tmp_path / "broken_install.py").write_text("raise RuntimeError('a broken install')\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the fork server starts with the environment's path
    graphs = {"r": [fake("a", imports=("broken_install",)), fake("b", "a", imports=("broken_install",))]}
    report = execute(plan_fakes(monkeypatch, cache, graphs), cache, tmp_path / "artifacts", jobs=1)
    assert report.ok, report.failures()
    a, b = (step_data(report, f"r:{n}") for n in "ab")
    assert a["ppid"] == b["ppid"] == os.getpid()  # spawned by the build itself
    assert forkserver._forkserver._forkserver_pid is None


def test_a_ray_task_refuses_a_node_whose_packages_differ_from_the_key_and_starts_from_an_empty_out(
    cache: Cache, tmp_path: Path
) -> None:
    """#40: a step on a cluster node checks the package versions its key holds against its own
    before running, and names each mismatch; a retried attempt does not inherit what a dead one
    left in ``out/`` (the runner would commit it as this attempt's)."""
    from dataclasses import replace

    from onnxbuild.engine.cluster import _run_shared
    from onnxbuild.engine.execute import Task
    from onnxbuild.steps import describe

    spec = describe(fake("a"))
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    (out / "a.txt").write_text("half of what a killed attempt wrote", encoding="utf-8")
    ctx = StepContext(
        recipe_name="r",
        recipe_path="recipes/r.yaml",
        recipe_dir=tmp_path,
        input_dir=tmp_path / "work" / "in",
        output_dir=out,
        versions={"numpy": "0.0.1", "onnxbuild-no-such-package": "not installed"},
    )
    refused = _run_shared(Task(spec, ctx, str(tmp_path / "work" / "step.log")))
    assert not refused.ok and refused.error == (
        f"this node's packages differ from the step's key (numpy {package_version('numpy')} here, 0.0.1 in the "
        "key): install the planning machine's versions on every node (pip install -c constraints.txt ...)"
    )
    assert (out / "a.txt").read_text(encoding="utf-8").startswith("half")  # refused before touching anything
    ctx = replace(ctx, versions={"numpy": package_version("numpy")})
    done = _run_shared(Task(replace(spec, params={"skip_outputs": ["a.txt"]}), ctx, str(tmp_path / "step.log")))
    assert done.ok and list(out.iterdir()) == []  # the stale a.txt is gone, not taken as this attempt's


def test_an_exclusive_step_runs_alone_whatever_jobs_says(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Benchmarks declare EXCLUSIVE: with -j 2 nothing overlaps them, so their figures are not shared cores."""
    from dataclasses import replace

    from helpers_exclusive import NAME as EXCLUSIVE_KIND
    from helpers_exclusive import register_exclusive

    register_exclusive()
    bench = replace(fake("bench", sleep=1.0), kind=EXCLUSIVE_KIND)
    plan = plan_fakes(monkeypatch, cache, {"r": [fake("a", sleep=1.0), bench, fake("c", sleep=1.0)]})
    report = execute(plan, cache, tmp_path / "artifacts", jobs=2)

    assert report.ok
    a, b, c = (step_data(report, f"r:{n}") for n in ("a", "bench", "c"))
    for other in (a, c):
        assert b["start"] >= other["end"] or other["start"] >= b["end"]
    assert max(a["start"], c["start"]) < min(a["end"], c["end"])  # the others still share the two jobs


def test_changed_param_reruns_exactly_the_step_and_its_dependents(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def steps(b_text: str, note: str = "") -> list[StepSpec]:
        # a -> b -> c, and a -> d
        return [fake("a"), fake("b", "a", text=b_text, note=note), fake("c", "b"), fake("d", "a")]

    execute(plan_fakes(monkeypatch, cache, {"r": steps("b")}), cache, tmp_path / "artifacts", in_process=True)

    plan = plan_fakes(monkeypatch, cache, {"r": steps("B")})
    assert reasons(plan) == {
        "r:a": ("cached", ("up to date",)),
        "r:b": ("run", ('text changed "b" -> "B"',)),
        "r:c": ("run", ("only if its input from b changes",)),
        "r:d": ("cached", ("up to date",)),
    }
    report = execute(plan, cache, tmp_path / "artifacts", in_process=True)
    assert built(report) == {"r:b", "r:c"}

    # A change that leaves b's bytes alone stops there.
    report = execute(
        plan_fakes(monkeypatch, cache, {"r": steps("B", note="x")}), cache, tmp_path / "artifacts", in_process=True
    )
    assert outcomes(report)["r:c"] == ("cached", "inputs were rebuilt identical")
    assert built(report) == {"r:b"}


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "step-processes"])
def test_failure_skips_dependents_and_keep_going_builds_the_rest(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process: bool
) -> None:
    graphs = {"r": [fake("a", fail="boom"), fake("b", "a"), fake("c", "b"), fake("d")]}
    skipped_b = ("skipped", "not run: depends on a, which failed")
    skipped_c = ("skipped", "not run: depends on b, which was skipped")

    recorder = Recorder()
    report = execute(
        plan_fakes(monkeypatch, cache, graphs), cache, tmp_path / "artifacts", in_process=in_process, reporter=recorder
    )
    assert not report.ok
    assert outcomes(report) == {
        "r:a": ("failed", "boom"),
        "r:b": skipped_b,
        "r:c": skipped_c,
        "r:d": (
            "skipped",
            "not run: the build stopped at the first failure (use --keep-going to build everything that does not "
            "depend on it)",
        ),
    }
    assert recorder.started == ["r:a"]
    with pytest.raises(BuildFailed) as exc:
        raise_for_failures(report)
    assert str(exc.value) == "r: step a failed: boom\nskipped: r:b, r:c, r:d"
    assert exc.value.exit_code == 1

    report = execute(
        plan_fakes(monkeypatch, cache, graphs), cache, tmp_path / "artifacts", keep_going=True, in_process=in_process
    )
    assert not report.ok
    assert outcomes(report) == {
        "r:a": ("failed", "boom"),
        "r:b": skipped_b,
        "r:c": skipped_c,
        "r:d": ("built", "no entry in cache (never built)"),
    }
    assert [e["step"] for e in whole_entries(cache.root)] == ["d"]  # nothing cached for a failure
    assert set(read_json(cache.root / "last" / "r.json")) == {"d"}
    assert sorted(p.name for p in (tmp_path / "artifacts" / "r").iterdir()) == [
        "d.txt",
        "manifest.json",
        "timings.json",
    ]
    assert scratch_dirs(cache.root) == []


def test_a_step_that_skips_a_declared_output_fails(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_fakes(monkeypatch, cache, {"r": [fake("a", skip_outputs=["a.txt"])]})
    report = execute(plan, cache, tmp_path / "artifacts", in_process=True)
    assert outcomes(report) == {"r:a": ("failed", "the step finished without writing a.txt (a bug in the fake step)")}
    assert whole_entries(cache.root) == []


def test_two_recipes_sharing_a_step_build_it_once_with_jobs_2(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Used to deadlock: the second waited, in the runner's loop, for a key lock its own build held."""
    graphs = {"r1": [fake("s", sleep=0.2)], "r2": [fake("s", sleep=0.2)]}
    report = execute(plan_fakes(monkeypatch, cache, graphs), cache, tmp_path / "artifacts", jobs=2)
    assert outcomes(report) == {
        "r1:s": ("built", "no entry in cache (never built)"),
        "r2:s": ("cached", "built by r1:s in this build (the same step)"),
    }
    assert (tmp_path / "artifacts" / "r2" / "s.txt").read_text() == "s\n"


def test_ctrl_c_in_an_in_process_step_frees_its_lock_and_scratch(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_fakes(monkeypatch, cache, {"r": [fake("a", interrupt=True)]})
    with pytest.raises(KeyboardInterrupt):
        execute(plan, cache, tmp_path / "artifacts", in_process=True)
    assert scratch_dirs(cache.root) == []
    locks = sorted((cache.root / "locks").glob("*.lock"))
    assert [p.name for p in locks] == ["gc.lock", f"key-{plan.steps[0].key}.lock", "recipe-r.lock"]
    for path in locks:  # a later build in this process must not wait forever
        lock = FileLock(path)
        assert lock.try_acquire()
        lock.release()
    assert leftovers(cache.root) == []


def test_a_registered_module_must_be_importable_to_run_in_a_step_process(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(ctx: StepContext, spec: StepSpec) -> StepResult:
        ctx.output("a.txt").write_text("made in memory\n")
        return StepResult()

    module = types.ModuleType("made_in_memory")
    module.KIND = StepKind(name="in-memory", packages=(), plan=lambda p: [], run=run)  # type: ignore[attr-defined]
    module.run = run  # type: ignore[attr-defined]
    register("in-memory", module)
    spec = StepSpec(name="a", kind="in-memory", params={}, outputs=("a.txt",))

    report = execute(plan_fakes(monkeypatch, cache, {"r": [spec]}), cache, tmp_path / "artifacts", in_process=True)
    assert outcomes(report) == {"r:a": ("built", "no entry in cache (never built)")}

    report = execute(plan_fakes(monkeypatch, cache, {"r": [spec]}, force=True), cache, tmp_path / "artifacts")
    ((status, reason),) = outcomes(report).values()
    assert status == "failed"
    assert reason.startswith(
        "the in-memory step kind was registered from module 'made_in_memory', which a step process cannot import ("
    )


def test_steps_alike_but_for_their_outputs_have_different_keys(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Used to share one key: the second step was then 'cached' with the first's outputs."""
    plan = plan_fakes(monkeypatch, cache, {"r": [fake("a", text="x"), fake("b", text="x")]})
    a, b = plan.steps
    assert a.ingredients is not None and b.ingredients is not None
    assert {**a.ingredients, "outputs": None} == {**b.ingredients, "outputs": None}
    assert (a.ingredients["outputs"], b.ingredients["outputs"]) == (["a.txt"], ["b.txt"])
    assert a.key != b.key

    report = execute(plan, cache, tmp_path / "artifacts", in_process=True)
    assert built(report) == {"r:a", "r:b"}
    assert (tmp_path / "artifacts" / "r" / "b.txt").read_text() == "x\n"
    wider = StepSpec(name="a", kind="fake", params={"text": "x"}, outputs=("a.txt", "extra.txt"))
    assert reasons(plan_fakes(monkeypatch, cache, {"r": [wider]})) == {
        "r:a": ("run", ('its declared outputs changed (["a.txt"] -> ["a.txt", "extra.txt"])',))
    }


def test_a_named_list_that_grew_is_explained_item_by_item() -> None:
    from onnxbuild._util import json_changes as _changes
    from onnxbuild.engine.graph import _change_words

    old = {"inputs": [{"name": "input_ids", "shape": ["batch", "sequence"]}]}
    new = {
        "inputs": [
            {"name": "input_ids", "shape": ["batch", 16]},
            {"name": "position_ids", "shape": ["batch", "sequence"]},
        ]
    }
    words = [f"{path} {_change_words(a, b)}" for path, a, b in _changes(old, new)]
    assert words == [
        'inputs[input_ids].shape[1] changed "sequence" -> 16',
        'inputs[position_ids] added ({"name": "position_ids", "shape": ["batch", "sequence"]})',
    ]


def test_a_ray_task_refuses_a_node_whose_onnxbuild_code_differs_from_the_key(tmp_path: Path) -> None:
    """#53: the key holds the planner's onnxbuild code; a node running other code (another
    checkout or version) would file its outputs under that key, so it refuses, naming the modules."""
    from dataclasses import replace

    from onnxbuild.engine.cluster import code_differs
    from onnxbuild.engine.codekeys import Code
    from onnxbuild.engine.execute import Task
    from onnxbuild.spec import StepSpec
    from onnxbuild.steps import describe

    spec = describe(StepSpec(name="report", kind="report", params={"variants": []}))
    code = Code().reach((spec.entry, *spec.code_also), spec.code_stops)
    ctx = StepContext(
        recipe_name="r",
        recipe_path="recipes/r.yaml",
        recipe_dir=tmp_path,
        input_dir=tmp_path / "in",
        output_dir=tmp_path / "out",
        code=code,
    )
    assert code_differs(Task(spec, ctx, str(tmp_path / "step.log"))) is None
    wrong = replace(ctx, code={**code, "onnxbuild.report.validation": "0" * 16})
    refused = code_differs(Task(spec, wrong, str(tmp_path / "step.log")))
    assert refused is not None and not refused.ok
    assert refused.error == (
        "this node's onnxbuild code differs from the step's key (onnxbuild.report.validation): install the "
        "planning machine's onnxbuild on every node"
    )
