"""Executing a plan: run steps (in parallel where the DAG allows), commit, materialise.

The runner decides nothing about policy: the plan says what to run. It only
re-derives a step's key when the step's inputs have just been rebuilt, fails a step
whose declared outputs are missing, skips the dependents of a failure (naming it),
and writes each recipe's artifacts and manifest under a lock.

One module (~690 lines) because its parts share one state machine (``_State`` per step:
waiting, running, cached, failed, skipped) that splitting would turn into a protocol;
placing files in artifact folders and their trust checks are in artifacts.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from onnxbuild._util import (
    atomic_write_text,
    pretty_json,
    write_if_changed,
)
from onnxbuild.engine import admission
from onnxbuild.engine.artifacts import (
    artifact_folder,
    check_places,
    inside,
    keep_failed_outputs,
    link_or_copy,
    materialise,
    previous_owners,
    remove_stale_temps,
    save_log,
)
from onnxbuild.engine.cache import (
    Cache,
    EntryRecord,
    OutputRecord,
    step_key,
)
from onnxbuild.engine.execute import Outcome, Task, run_task
from onnxbuild.engine.executors import Executor, Handle, LocalExecutor
from onnxbuild.engine.graph import FORCED, Ingredients, Plan, PlannedStep, explain, ingredients, input_digests
from onnxbuild.engine.locks import FileLock
from onnxbuild.engine.manifest import Status, StepRecord, Timings, make_manifest
from onnxbuild.engine.testhooks import pause_for_tests
from onnxbuild.errors import BuildFailed
from onnxbuild.recipe.model import Recipe
from onnxbuild.spec import StepContext

LOCK_TIMEOUT_S = 6 * 3600.0
RETRY_S = 0.1
"""How often a step whose key another process is building checks again, while this build's own steps run."""


class Reporter(Protocol):
    """What a build tells the user as it goes: a step started, finished, a warning."""

    def step_started(self, step: PlannedStep) -> None: ...
    def step_finished(self, step: PlannedStep, record: StepRecord, seconds: float) -> None: ...
    def warning(self, message: str) -> None: ...


class NullReporter:
    """A Reporter that says nothing (the library API's default)."""

    def step_started(self, step: PlannedStep) -> None:
        pass

    def step_finished(self, step: PlannedStep, record: StepRecord, seconds: float) -> None:
        pass

    def warning(self, message: str) -> None:
        pass


@dataclass
class RecipeOutcome:
    """One recipe's result: its step records, artifact folder and timings."""

    recipe: Recipe
    steps: list[StepRecord]
    artifacts: Path
    timings: Timings

    @property
    def ok(self) -> bool:
        return all(s["status"] in ("built", "cached") for s in self.steps)


@dataclass
class BuildReport:
    """What ``make`` did for every recipe; ``ok`` when no step failed."""

    recipes: list[RecipeOutcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.recipes)

    def failures(self) -> list[tuple[str, StepRecord]]:
        return [(r.recipe.name, s) for r in self.recipes for s in r.steps if s["status"] == "failed"]


@dataclass
class _State:
    planned: PlannedStep
    record: StepRecord | None = None
    entry: EntryRecord | None = None
    seconds: float = 0.0
    peak_rss_mb: float | None = None
    lock: FileLock | None = None
    """The step's key lock, held from launch until its outcome is committed."""
    since: float = field(default_factory=time.time)
    """When this build took the step on: a cache entry written after it came from another process."""
    left_out: bool = False
    """A step beyond --target that turned out not to be current: in no record, report or manifest."""
    expected: dict[str, str] | None = None
    """With ``make --frozen``: the output digests the lock holds this step to."""


def execute(
    plan: Plan,
    cache: Cache,
    artifacts_root: Path,
    *,
    jobs: int = 1,
    keep_going: bool = False,
    in_process: bool = False,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    expected: dict[str, dict[str, str]] | None = None,
) -> BuildReport:
    """Run ``plan``; returns the per-recipe outcome (raise nothing for step failures).

    ``expected`` (``make --frozen``): step label -> the output digests the lock records; a
    step whose outputs, built or taken from a (remote) cache, differ fails, naming both.

    ``executor`` decides where each step runs (local processes by default); nothing else
    here depends on it.
    """
    reporter = reporter or NullReporter()
    owned = executor is None
    executor = executor or LocalExecutor()
    executor.check([(s.label, s.spec.resources) for s in plan.steps if s.action == "run"])
    if executor.name == "local" and not keep_going:
        # refused up front, not after the steps before it ran: an 8B model's source step alone
        # writes its 32 GB of random-init weights (with --keep-going the others still run)
        for s in plan.steps:
            refused = admission.refusal(s.spec, s.spec.limits) if s.action == "run" else None
            if refused is not None:
                raise BuildFailed(f"{s.recipe.name}: step {s.spec.name} {refused}; no step was started")
    cache.warn = reporter.warning
    start = time.perf_counter()
    cache.ensure_writable()
    maintenance = cache.maintenance_lock(shared=True)
    maintenance.timeout = LOCK_TIMEOUT_S
    maintenance.acquire()
    try:
        if not in_process:
            executor.prepare([s.spec for s in plan.steps if s.action == "run"])
        cache.clean_scratch()
        for recipe in plan.recipes:
            folder = artifact_folder(artifacts_root, recipe.name)
            check_places(folder, [o for s in plan.steps if s.recipe is recipe for o in s.spec.outputs])
        report = _execute_locked(
            plan,
            cache,
            artifacts_root,
            jobs=jobs,
            keep_going=keep_going,
            in_process=in_process,
            reporter=reporter,
            executor=executor,
            expected=expected or {},
        )
    finally:
        try:
            maintenance.release()
        finally:
            if owned:
                executor.close()
    cache.save_state()
    report.seconds = time.perf_counter() - start
    return report


def _execute_locked(
    plan: Plan,
    cache: Cache,
    artifacts_root: Path,
    *,
    jobs: int,
    keep_going: bool,
    in_process: bool,
    reporter: Reporter,
    executor: Executor,
    expected: dict[str, dict[str, str]],
) -> BuildReport:
    with _recipe_locks(cache, plan.recipes, reporter):
        states = {s.label: _State(s, expected=expected.get(s.label)) for s in plan.steps}
        _run_all(
            states,
            plan,
            cache,
            artifacts_root,
            jobs=max(1, jobs),
            keep_going=keep_going,
            in_process=in_process,
            reporter=reporter,
            executor=executor,
        )
        report = BuildReport()
        for recipe in plan.recipes:
            mine = [st for st in states.values() if st.planned.recipe is recipe]
            report.recipes.append(_finish_recipe(recipe, mine, cache, artifacts_root))
    return report


@contextlib.contextmanager
def _recipe_locks(cache: Cache, recipes: tuple[Recipe, ...], reporter: Reporter) -> Iterator[None]:
    locks = []
    try:
        for name in sorted({r.name for r in recipes}):  # sorted: two builds never wait on each other in a cycle
            lock = cache.lock(f"recipe-{name}", what=f"recipe {name}")
            lock.timeout = LOCK_TIMEOUT_S
            probe_started = time.monotonic()
            lock.acquire()
            if lock.waited:
                reporter.warning(
                    f"waited {time.monotonic() - probe_started:.1f}s for another onnxbuild building {name}"
                )
            locks.append(lock)
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


def _run_all(
    states: dict[str, _State],
    plan: Plan,
    cache: Cache,
    artifacts_root: Path,
    *,
    jobs: int,
    keep_going: bool,
    in_process: bool,
    reporter: Reporter,
    executor: Executor,
) -> None:
    order = [s.label for s in plan.steps]
    running: dict[Handle, tuple[str, Path]] = {}
    stopped = False

    def dep_labels(label: str) -> list[str]:
        p = states[label].planned
        return [f"{p.recipe.name}:{d}" for d in p.spec.deps]

    try:
        while True:
            progressed = False
            deferred = False
            for label in order:
                st = states[label]
                if st.record is not None or any(label == lab for lab, _ in running.values()):
                    continue
                deps = [states[d] for d in dep_labels(label)]
                failed = [d for d in deps if d.record is not None and d.record["status"] in ("failed", "skipped")]
                if failed and st.planned.action == "outside":
                    _leave_out(st)
                    progressed = True
                    continue
                if failed:
                    names = ", ".join(d.planned.spec.name for d in failed)
                    _skip(
                        st,
                        f"not run: depends on {names}, which "
                        f"{'failed' if failed[0].record and failed[0].record['status'] == 'failed' else 'was skipped'}",
                        reporter,
                    )
                    progressed = True
                    continue
                if stopped:
                    continue
                if any(d.record is None for d in deps):
                    continue
                if len(running) >= jobs:
                    continue
                # Measuring steps (benchmarks) run alone: a step beside them would steal
                # cores and make the figures lie, whatever -j says.
                if running and (_exclusive(st) or any(_exclusive(states[lab]) for lab, _ in running.values())):
                    continue
                child = _start(
                    st,
                    states,
                    cache,
                    artifacts_root,
                    may_defer=bool(running),
                    in_process=in_process,
                    reporter=reporter,
                    executor=executor,
                )
                if child is not None:
                    running[child[0]] = (label, child[1])
                    progressed = True
                elif st.record is None:
                    deferred = True  # its key is being built elsewhere; look again after a wait
                else:
                    progressed = True
                    if st.record["status"] == "failed" and not keep_going:
                        stopped = True
            if running:
                ready = executor.wait(list(running), timeout=RETRY_S if deferred else None)
                for handle in ready:
                    label, workdir = running.pop(handle)
                    _finish(states[label], handle.outcome(), workdir, cache, reporter, artifacts_root)
                    if states[label].record and states[label].record["status"] == "failed" and not keep_going:  # type: ignore[index]
                        stopped = True
                continue
            if not progressed:
                break
    except BaseException:
        for handle, (label, workdir) in running.items():
            handle.kill()
            _release(states[label], workdir)
        raise
    for label in order:
        st = states[label]
        if st.record is None and st.planned.action == "outside":
            _leave_out(st)
        elif st.record is None:
            _skip(
                st,
                "not run: the build stopped at the first failure "
                "(use --keep-going to build everything that does not depend on it)",
                reporter,
            )


def _exclusive(st: _State) -> bool:
    return st.planned.spec.exclusive


def _leave_out(st: _State) -> None:
    st.record = _record(st.planned, None, "skipped", "outside --target and not current", None)
    st.left_out = True


def _skip(st: _State, reason: str, reporter: Reporter) -> None:
    st.record = _record(st.planned, None, "skipped", reason, None)
    reporter.step_finished(st.planned, st.record, 0.0)


def _record(p: PlannedStep, key: str | None, status: Status, reason: str, entry: EntryRecord | None) -> StepRecord:
    return {
        "name": p.spec.name,
        "kind": p.spec.kind,
        "key": key,
        "status": status,
        "reason": reason,
        "outputs": list(entry["outputs"]) if entry else [],
        "data": dict(entry["data"]) if entry else {},
    }


def _start(
    st: _State,
    states: dict[str, _State],
    cache: Cache,
    artifacts_root: Path,
    *,
    may_defer: bool,
    in_process: bool,
    reporter: Reporter,
    executor: Executor,
) -> tuple[Handle, Path] | None:
    """Resolve the step's key now that its inputs exist; use the cache or launch it.

    Returns the launched process, or None when the step is done (cached, or run here
    in-process) or deferred (``st.record`` still None: its key is locked and
    ``may_defer``, because this build has steps running that it must not stop collecting).
    """
    p = st.planned
    forced = p.forced
    if p.key is not None:
        key, ing, reason = p.key, p.ingredients, p.reason
    else:
        entries = {d: states[f"{p.recipe.name}:{d}"].entry for d in p.spec.deps}
        measured = frozenset(d for d in p.spec.deps if states[f"{p.recipe.name}:{d}"].planned.spec.measured)
        ing = ingredients(p.spec, input_digests(p.spec, entries, measured), cache)
        key = step_key(ing)
        last = cache.last_build(p.recipe.name).get(p.spec.name)
        reason = FORCED if forced else "; ".join(explain(last, ing, key))
    assert ing is not None
    entry = None if forced else cache.get(key)
    if entry is not None:
        _cached(st, states, key, ing, entry, reporter, cache)
        return None
    if p.action == "outside":
        _leave_out(st)
        return None
    lock = cache.lock(f"key-{key}", what=f"step {p.label}")
    lock.timeout = LOCK_TIMEOUT_S
    if not lock.try_acquire():
        # Never wait here while our own steps run: one of them may hold this very key
        # (two recipes sharing a step), and their results are collected only by this loop.
        if may_defer:
            return None
        lock.acquire()
    # Another process may have built the same key while we waited for its lock.
    entry = None if forced else cache.get(key)
    if entry is not None:
        lock.release()
        _cached(st, states, key, ing, entry, reporter, cache)
        return None
    workdir = cache.scratch()
    (workdir / "out").mkdir()
    inputs_dir = workdir / "in"
    placed: dict[str, str] = {}
    for inp in p.spec.inputs:
        dep = states[f"{p.recipe.name}:{inp.step}"].entry
        assert dep is not None
        sha = {o["path"]: o["sha256"] for o in dep["outputs"]}[inp.path]
        link_or_copy(cache.object_path(sha), inputs_dir / inp.path)
        placed[inp.path] = sha
    # Companion files (external tensor data, a record's weights) travel with the file that names them.
    for inp in p.spec.inputs:
        dep = states[f"{p.recipe.name}:{inp.step}"].entry
        assert dep is not None
        if not (inp.path.endswith(".onnx") or inp.companions):
            continue
        for o in dep["outputs"]:
            if not o["path"].startswith("reports/") and not (inputs_dir / o["path"]).exists():
                link_or_copy(cache.object_path(o["sha256"]), inputs_dir / o["path"])
                placed[o["path"]] = o["sha256"]
    ctx = StepContext(
        recipe_name=p.recipe.name,
        recipe_path=p.recipe.path,
        recipe_dir=p.recipe.directory,
        input_dir=inputs_dir,
        output_dir=workdir / "out",
        digests={label: v for label, v in ing["files"].items()},
        versions=dict(ing["packages"]),
        code=dict(ing["code"]),
    )
    st.record = None
    st.planned = PlannedStep(p.recipe, p.spec, "run", (reason,), key, ing, None)
    st.lock = lock
    reporter.step_started(st.planned)
    log_path = workdir / "step.log"
    refused = admission.refusal(p.spec, p.spec.limits) if executor.name == "local" else None
    if refused is not None:  # it would be killed part-way: say so before it starts
        _finish(st, Outcome(False, error=refused), workdir, cache, reporter, artifacts_root)
        return None
    task = Task(p.spec, ctx, str(log_path))
    try:
        if not in_process:
            return executor.start(task, p.spec.resources, placed, p.spec.outputs), workdir
        outcome = run_task(Task(p.spec, StepContext(**{**ctx.__dict__, "log": lambda m: None}), str(log_path)))
    except BaseException:  # Ctrl-C in an in-process step, or no process could be started
        _release(st, workdir)
        raise
    _finish(st, outcome, workdir, cache, reporter, artifacts_root)
    return None


def _cached(
    st: _State,
    states: dict[str, _State],
    key: str,
    ing: Ingredients,
    entry: EntryRecord,
    reporter: Reporter,
    cache: Cache,
) -> None:
    """Take the step from the cache, saying truthfully why it is there."""
    p = st.planned
    recipe = p.recipe.name
    outside = p.action == "outside"
    same = next(
        (
            o.planned.label
            for o in states.values()
            if o.record and o.record["status"] == "built" and o.record["key"] == key
        ),
        None,
    )
    if key in cache.pulled:
        why = "pulled from the remote cache"
    elif p.action == "cached":
        why = "up to date"
    elif same is not None:
        why = f"built by {same} in this build (the same step)"
    elif (
        p.key is None
        and any(_status(states[f"{recipe}:{d}"]) == "built" for d in p.spec.deps)
        and not _written_since(cache, key, st.since)
    ):
        why = "inputs were rebuilt identical"
    elif outside:
        why = "up to date"
    else:
        why = "built meanwhile by another onnxbuild"
    differs = _differs_from_lock(st, entry)
    if differs:
        cache.discard(key)  # never served again: a plain make rebuilds it
        st.planned = PlannedStep(p.recipe, p.spec, "run", (why,), key, ing, None)
        st.record = _record(st.planned, key, "failed", differs, None)
        reporter.step_finished(st.planned, st.record, 0.0)
        return
    # Keep the key and ingredients: the last-build record needs them to explain the next change.
    st.planned = PlannedStep(p.recipe, p.spec, "cached", (why,), key, ing, entry)
    st.entry = entry
    st.record = _record(st.planned, key, "cached", why, entry)
    reporter.step_finished(st.planned, st.record, 0.0)


def _differs_from_lock(st: _State, entry: EntryRecord) -> str:
    """Why ``make --frozen`` refuses this step's outputs (they differ from the lock), or ""."""
    if st.expected is None:
        return ""
    got = {o["path"]: o["sha256"] for o in entry["outputs"]}
    for path, want in sorted(st.expected.items()):
        if got.get(path) != want:
            return (
                f"--frozen: {path} has sha256 {str(got.get(path))[:16]}, the lock says {want[:16]} "
                "(a poisoned or stale cache entry, or a build that is not reproducible here); "
                "nothing was written to the artifact folder"
            )
    return ""


def _written_since(cache: Cache, key: str, since: float) -> bool:
    try:
        return cache.entry_path(key).stat().st_mtime >= since
    except OSError:
        return False


def _release(st: _State, workdir: Path) -> None:
    """Free a started step's key lock and drop its scratch folder (once committed, failed, or given up)."""
    if st.lock is not None:
        st.lock.release()
        st.lock = None
    shutil.rmtree(workdir, ignore_errors=True)


def _status(st: _State) -> str | None:
    """The step's status, or None before it has a record."""
    return st.record["status"] if st.record is not None else None


def _finish(
    st: _State, outcome: Outcome, workdir: Path, cache: Cache, reporter: Reporter, artifacts_root: Path
) -> None:
    p = st.planned
    try:
        st.seconds = outcome.seconds
        st.peak_rss_mb = outcome.peak_rss_mb
        attempts = outcome.attempts
        out = workdir / "out"
        result = outcome.result
        if outcome.ok and result is not None:
            declared = set(p.spec.outputs)
            written = {f.relative_to(out).as_posix() for f in out.rglob("*") if f.is_file()}
            missing = sorted(declared - written)
            extra = set(result.extra_outputs)
            if missing:
                outcome = Outcome(
                    False,
                    error=f"the step finished without writing {', '.join(missing)} (a bug in the {p.spec.kind} step)",
                    seconds=outcome.seconds,
                )
            else:
                assert p.key is not None and p.ingredients is not None
                data = dict(result.data)
                if result.summary:
                    data["summary"] = result.summary
                for w in result.warnings:
                    reporter.warning(f"{p.label}: {w}")
                if result.warnings:
                    data["warnings"] = list(result.warnings)
                files = sorted(declared | (extra & written))
                entry = cache.commit(p.key, p.spec.name, p.spec.kind, p.ingredients, out, files, data, keep=result.keep)
                differs = _differs_from_lock(st, entry)
                if differs:
                    st.record = _record(p, p.key, "failed", differs, None)
                else:
                    st.entry = entry
                    st.record = _record(p, p.key, "built", p.reason, entry)
        if not outcome.ok:
            message = outcome.error
            if outcome.detail:
                saved = save_log(workdir, artifacts_root, p)
                if saved:
                    message += f" (full log: {saved})"
            st.record = _record(p, p.key, "failed", message, None)
            keep_failed_outputs(workdir / "out", artifacts_root, p)
        assert st.record is not None
        if attempts > 1:
            st.record["attempts"] = attempts
        reporter.step_finished(p, st.record, st.seconds)
    finally:
        _release(st, workdir)


def _finish_recipe(recipe: Recipe, states: list[_State], cache: Cache, artifacts_root: Path) -> RecipeOutcome:
    """Materialise the outputs of every step that succeeded, then write the manifest last."""
    folder = artifact_folder(artifacts_root, recipe.name)
    states = [st for st in states if not st.left_out]
    records = [st.record for st in states if st.record is not None]
    previous = previous_owners(folder)
    remove_stale_temps(folder)
    current: dict[str, OutputRecord] = {}
    for st in states:
        if st.entry is not None:
            for o in st.entry["outputs"]:
                current[o["path"]] = o
    for rel, o in sorted(current.items()):
        materialise(cache, o, folder, rel)
    # Files an earlier build wrote that this one no longer produces (e.g. an external-data file).
    failed_steps = {
        st.planned.spec.name
        for st in states
        if st.record and st.record["status"] != "built" and st.record["status"] != "cached"
    }
    for rel in sorted(set(previous) - set(current)):
        if previous[rel] in failed_steps:
            continue  # keep what an earlier good build of a now-failing step left
        if not inside((folder / rel).parent, folder):
            continue  # the manifest is a file in the work tree: "../" or "/" paths in it delete nothing
        with contextlib.suppress(OSError):
            (folder / rel).unlink()
    for st in states:
        failed = folder / "failed" / st.planned.spec.name
        if st.record and st.record["status"] in ("built", "cached") and inside(failed, folder):
            shutil.rmtree(failed, ignore_errors=True)
    with contextlib.suppress(OSError):
        (folder / "failed").rmdir()
    manifest = make_manifest(
        recipe.name,
        {"path": _display_path(recipe), "digest": recipe.digest, "resolved": recipe.resolved},
        records,
        lookup=cache.versions.get,
    )
    folder.mkdir(parents=True, exist_ok=True)
    write_if_changed(
        folder / "manifest.json", pretty_json(manifest), lambda: pause_for_tests("manifest-write", recipe.name)
    )
    last = cache.last_build(recipe.name)

    def build_seconds(st: _State) -> float | None:
        """What building the step cost when its output was made: this run, or the build it was cached from."""
        if st.record and st.record["status"] == "built":
            return round(st.seconds, 3)
        before = last.get(st.planned.spec.name, {})
        known = before.get("seconds") if st.record and before.get("key") == st.record["key"] else None
        return known if isinstance(known, (int, float)) else None

    timings: Timings = {
        "steps": {
            st.planned.spec.name: {
                "status": st.record["status"] if st.record else None,
                "reason": st.record["reason"] if st.record else None,
                "seconds": round(st.seconds, 3),
                "build_seconds": build_seconds(st),
                "peak_rss_mb": st.peak_rss_mb,
            }
            for st in states
        }
    }
    atomic_write_text(folder / "timings.json", pretty_json(timings))
    good = {
        st.planned.spec.name: {
            "key": st.record["key"],
            "ingredients": st.planned.ingredients,
            "seconds": build_seconds(st),
        }
        for st in states
        if st.record and st.record["status"] in ("built", "cached")
    }
    last.update(good)
    cache.record_last_build(recipe.name, last)
    return RecipeOutcome(recipe, records, folder, timings)


def _display_path(recipe: Recipe) -> str:
    path = Path(recipe.path)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            pass
    # Under LC_ALL=C a non-ASCII path arrives with surrogate escapes, which JSON cannot hold:
    # the file system's bytes are shown as the UTF-8 text they almost always are.
    return os.fsencode(path.as_posix()).decode("utf-8", errors="backslashreplace")


def raise_for_failures(report: BuildReport) -> None:
    failures = report.failures()
    if not failures:
        return
    lines = []
    for recipe, step in failures:
        lines.append(f"{recipe}: step {step['name']} failed: {step['reason']}")
    skipped = [f"{r.recipe.name}:{s['name']}" for r in report.recipes for s in r.steps if s["status"] == "skipped"]
    if skipped:
        lines.append("skipped: " + ", ".join(skipped))
    raise BuildFailed("\n".join(lines))
