"""The library API the CLI is a thin layer over: load, plan, build, inspect, clean.

One module (~560 lines): one documented function per command of the CLI, so the public API
reads as one list; the work is in engine/, review/ and the kinds."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from onnxbuild.engine.cache import Cache, tagged
from onnxbuild.engine.graph import Plan
from onnxbuild.engine.runner import BuildReport, Reporter
from onnxbuild.errors import CacheError, OnnxbuildError, RecipeError, UsageError
from onnxbuild.recipe import loader
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.resolve import DEFAULT_ATOL, DEFAULT_RTOL
from onnxbuild.recipe.sections import Resolved, ValidateSection
from onnxbuild.report.pagekey import is_current
from onnxbuild.steps import kinds
from onnxbuild.steps.exporting import section as export_kind

if TYPE_CHECKING:
    from onnxbuild.engine.locks import FileLock
    from onnxbuild.review.upgrade import Comparison
    from onnxbuild.steps.validating.divergence import Search

CACHE_ENV = "ONNXBUILD_CACHE_DIR"
RAY_JOBS = 256
"""Steps submitted at once to Ray when -j is not given; Ray queues what it cannot place yet."""


@dataclass(frozen=True)
class Settings:
    """Where a build keeps its cache and writes its artifacts."""

    cache_dir: Path = field(default_factory=lambda: Path(os.environ.get(CACHE_ENV) or ".onnxbuild/cache"))
    artifacts_dir: Path = Path("artifacts")
    cache_url: str | None = None
    """A remote cache (any fsspec URL) shared with other machines; None for local only."""
    cache_read_only: bool = False

    def cache(self, reporter: Reporter | None = None) -> Cache:
        cache = Cache(self.cache_dir)
        if reporter is not None:
            cache.warn = reporter.warning
        if self.cache_url:
            from onnxbuild.engine.remote import RemoteCache, config_from_project, options_from_config
            from onnxbuild.engine.signing import from_environment

            config = config_from_project(Path.cwd())
            signer, verifier = from_environment(config)
            cache.remote = RemoteCache(
                self.cache_url,
                read_only=self.cache_read_only,
                signer=signer,
                verifier=verifier,
                options=options_from_config(config, "[tool.onnxbuild] in pyproject.toml or onnxbuild.toml"),
            )
        return cache


def load_recipe(path: str | Path, memo_dir: Path | None = None, *, write_memo: bool = True) -> Recipe:
    """Load, validate and resolve one recipe, checked by every step kind (see
    ``recipe.loader.load_recipe``).

    Raises:
        RecipeError: listing every problem found, each with file, line and column.
    """
    return loader.load_recipe(path, kinds, memo_dir, write_memo=write_memo)


def parse_recipe(text: str, shown: str) -> Resolved:
    """Recipe text validated by the schema and every step kind, with every default filled in."""
    return loader.parse_recipe(text, shown, kinds())


def load_recipes(paths: Sequence[str | Path], settings: Settings | None = None) -> list[Recipe]:
    """Load every recipe, reporting the problems of all of them together."""
    memo = _memo_dir(settings)
    if not paths:
        raise UsageError("name at least one recipe, e.g. onnxbuild make recipes/gpt2.yaml")
    recipes: list[Recipe] = []
    problems = []
    for path in paths:
        try:
            recipes.append(load_recipe(path, memo, write_memo=False))
        except RecipeError as exc:
            problems.extend(exc.problems)
    if problems:
        raise RecipeError(problems)
    _remember(recipes, settings)  # only once all loaded: a failed command leaves nothing behind
    return recipes


def _remember(recipes: Sequence[Recipe], settings: Settings | None) -> None:
    """Each recipe's resolved form in the cache's memo, so the next command skips YAML and the
    schema; only in a cache onnxbuild made (a folder it would refuse gets nothing written), so a
    first build writes it once its cache exists."""
    memo = _memo_dir(settings)
    if memo is None:
        return
    from onnxbuild.recipe.loader import remember

    for recipe in recipes:
        remember(recipe, memo)


def _memo_dir(settings: Settings | None) -> Path | None:
    """Where resolved recipes are remembered: only in a cache onnxbuild made (tagged), so a
    memo is neither read from nor written into a folder it would refuse as a cache."""
    return settings.cache_dir / "state" / "recipes" if settings is not None and tagged(settings.cache_dir) else None


def plan(
    paths: Sequence[str | Path],
    settings: Settings | None = None,
    *,
    force: bool = False,
    target: str | None = None,
    single: bool = False,
    reporter: Reporter | None = None,
) -> Plan:
    """What a build would do, and why, without doing it."""
    from onnxbuild.engine.graph import plan as make_plan

    settings = settings or Settings()
    cache = settings.cache(reporter)
    cache.dry = True
    from dataclasses import replace

    from onnxbuild.engine.artifacts import out_of_step
    from onnxbuild.pipeline import steps_for

    result = make_plan(load_recipes(paths, settings), cache, steps_for, force=force, target=target, single=single)
    result = replace(result, out_of_step=tuple(out_of_step(result, settings.artifacts_dir, cache)))
    cache.save_state()
    return result


def build(
    paths: Sequence[str | Path],
    settings: Settings | None = None,
    *,
    jobs: int | None = None,
    keep_going: bool = False,
    force: bool = False,
    target: str | None = None,
    single: bool = False,
    reporter: Reporter | None = None,
    in_process: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    ray_retries: int = 2,
    frozen: bool = False,
) -> BuildReport:
    """Build the recipes' artifacts; step failures are in the report (see ``report.ok``).

    ``executor`` says where steps run: ``local`` processes (``jobs`` at once) or ``ray``
    tasks (a local Ray instance, or the cluster at ``ray_address``, which then needs the
    remote cache to move inputs and outputs between nodes).

    ``frozen`` (CI): each recipe's lock must match it, and every output, built or pulled
    from a cache, must have the digest the lock records, or that step fails naming both.
    """
    from onnxbuild.engine.graph import plan as make_plan
    from onnxbuild.engine.runner import execute

    settings = settings or Settings()
    if jobs is None:
        # Locally one step at a time unless asked; on Ray as many as the cluster places.
        jobs = RAY_JOBS if executor == "ray" else 1
    if jobs < 1:
        raise UsageError(f"-j/--jobs must be at least 1 (got {jobs})")
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor must be local or ray (got {executor!r})")
    recipes = load_recipes(paths, settings)
    cache = settings.cache(reporter)
    cache.ensure_writable()
    _remember(recipes, settings)
    expected = _frozen(recipes, cache) if frozen else None
    from onnxbuild.pipeline import steps_for

    the_plan = make_plan(recipes, cache, steps_for, force=force, target=target, single=single)
    runner_executor = None
    if executor == "ray" and any(s.action == "run" for s in the_plan.steps):  # nothing to run: no cluster needed
        from onnxbuild.engine.cluster import RayExecutor, RaySettings

        if ray_address is not None and settings.cache_read_only:
            raise UsageError(
                "--executor ray on a cluster pushes each step's outputs to the remote cache; drop --cache-read-only"
            )
        runner_executor = RayExecutor(
            RaySettings(address=ray_address, max_retries=ray_retries, remote_url=settings.cache_url)
        )
    try:
        report = execute(
            the_plan,
            cache,
            settings.artifacts_dir,
            jobs=jobs,
            keep_going=keep_going,
            in_process=in_process,
            reporter=reporter,
            executor=runner_executor,
            expected=expected,
        )
    finally:
        if runner_executor is not None:
            runner_executor.close()
    for outcome in report.recipes:
        _write_html(outcome.artifacts, reporter)
    return report


def _frozen(recipes: list[Recipe], cache: Cache) -> dict[str, dict[str, str]]:
    """The output digests each recipe's lock holds its steps to; a missing or stale lock is an error."""
    from onnxbuild.engine.lockfile import check_lock, expected_outputs, read_lock
    from onnxbuild.errors import BuildFailed
    from onnxbuild.pipeline import steps_for

    expected: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for recipe in recipes:
        stale = check_lock(recipe, cache, steps_for(recipe))
        if stale:
            problems.extend(stale)
            continue
        expected.update(expected_outputs(recipe, read_lock(recipe)))
    if problems:
        raise BuildFailed(
            "--frozen: the lock files do not match the recipes:\n  "
            + "\n  ".join(problems)
            + "\nrun `onnxbuild make RECIPE --lock` and commit the locks"
        )
    return expected


def _write_html(folder: Path, reporter: Reporter | None) -> Path | None:
    """report.html for a built folder; a page that cannot be written is a warning, never a failed build."""
    try:
        if is_current(folder):
            return folder / "report.html"
        from onnxbuild.report.page import write_report

        return write_report(folder)
    except (OnnxbuildError, OSError, ValueError) as exc:
        if reporter is not None:
            reporter.warning(f"could not write {folder}/report.html: {exc}")
        return None


def report(paths: Sequence[str | Path], settings: Settings | None = None) -> list[Path]:
    """(Re)write each recipe's ``artifacts/<name>/report.html`` from what its folder holds."""
    from onnxbuild.report.page import write_report

    settings = settings or Settings()
    written = []
    for recipe in load_recipes(paths):
        folder = settings.artifacts_dir / recipe.name
        if not (folder / "manifest.json").is_file():
            raise UsageError(f"{folder}/ has no manifest.json: build it first with `onnxbuild make {recipe.path}`")
        written.append(write_report(folder))
    return written


def write_locks(report: BuildReport, settings: Settings | None = None) -> list[Path]:
    """Write ``<recipe>.lock.json`` beside each recipe that built successfully."""
    from onnxbuild.engine.lockfile import write_lock

    cache = (settings or Settings()).cache()
    from onnxbuild.pipeline import steps_for

    return [write_lock(r.recipe, r.steps, cache, steps_for(r.recipe)) for r in report.recipes if r.ok]


def check_locks(paths: Sequence[str | Path], settings: Settings | None = None) -> list[str]:
    """Every way the recipes' lock files disagree with the recipes (empty: all current)."""
    from onnxbuild.engine.lockfile import check_lock
    from onnxbuild.pipeline import steps_for

    settings = settings or Settings()
    cache = settings.cache()
    from onnxbuild.engine.artifacts import rehash

    problems: list[str] = []
    for recipe in load_recipes(paths, settings):
        problems.extend(check_lock(recipe, cache, steps_for(recipe)))
        if (settings.artifacts_dir / recipe.name / "manifest.json").exists():
            problems.extend(rehash(settings.artifacts_dir / recipe.name))
    cache.save_state()
    return problems


def check_providers(report: BuildReport) -> None:
    """Raise BuildFailed when a benchmark could not use one of its recipe's target providers."""
    from onnxbuild.errors import BuildFailed

    problems = []
    for r in report.recipes:
        path = r.artifacts / "benchmark.json"
        if not path.is_file():
            continue
        for p in json.loads(path.read_text(encoding="utf-8")).get("providers", []):
            if p.get("status") == "skipped":
                problems.append(f"{r.recipe.name}: provider {p['name']} was skipped: {p['reason']}")
    if problems:
        raise BuildFailed("--strict-providers: " + "; ".join(problems))


def show(path: str | Path) -> str:
    """The recipe with every default filled in, as YAML: exactly what the cache hashes."""
    import yaml

    recipe = load_recipe(path)
    header = f"# {recipe.path}, resolved (every default filled in)\n"
    return header + yaml.safe_dump(
        recipe.resolved, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True
    )


def schema_text() -> str:
    from onnxbuild.recipe.loader import schema_text as text

    return text()


def dag(path: str | Path, fmt: str = "text") -> str:
    """The recipe's step graph as text, Mermaid or Graphviz dot."""
    from onnxbuild.pipeline import steps_for

    recipe = load_recipe(path)
    steps = steps_for(recipe)
    if fmt == "mermaid":
        lines = ["flowchart TD"]
        lines += [f'    {s.name.replace(".", "_")}["{s.name} ({s.kind})"]' for s in steps]
        lines += [f"    {d.replace('.', '_')} --> {s.name.replace('.', '_')}" for s in steps for d in s.deps]
        return "\n".join(lines) + "\n"
    if fmt == "dot":
        lines = [f'digraph "{recipe.name}" {{', "    rankdir=LR;"]
        lines += [f'    "{s.name}" [label="{s.name}\\n{", ".join(s.outputs)}"];' for s in steps]
        lines += [f'    "{d}" -> "{s.name}";' for s in steps for d in s.deps]
        return "\n".join(lines) + "\n}\n"
    if fmt != "text":
        raise UsageError(f"--format must be text, mermaid or dot (got {fmt!r})")
    lines = [f"{recipe.name} ({recipe.path})"]
    for s in steps:
        after = f"  <- {', '.join(s.deps)}" if s.deps else ""
        lines.append(f"  {s.name:<10} writes {', '.join(s.outputs)}{after}")
    return "\n".join(lines) + "\n"


def clean(paths: Sequence[str | Path], settings: Settings | None = None) -> list[Path]:
    """Remove the artifact folders of the given recipes (all of artifacts/ when none are given).

    The cache is kept, so the next build restores everything without rerunning steps.
    """
    settings = settings or Settings()
    root = settings.artifacts_dir
    removed: list[Path] = []
    if paths:
        targets = [root / r.name for r in load_recipes(paths)]
    else:
        targets = [p for p in sorted(root.iterdir()) if p.is_dir()] if root.is_dir() else []
    if targets:
        cache = settings.cache()
        locks = []
        if not cache.root.is_dir():  # no cache, so no build can be running: nothing to lock, nothing to create
            return _remove_folders(targets)
        cache.ensure_own()
        try:
            for folder in targets:
                lock = cache.lock(f"recipe-{folder.name}", what=f"recipe {folder.name}")
                if not lock.try_acquire():
                    raise CacheError(
                        f"another onnxbuild is building {folder.name}; run `onnxbuild clean` again when it ends"
                    )
                locks.append(lock)
            return _remove_folders(targets)
        finally:
            for lock in locks:
                lock.release()
    return removed


def _remove_folders(targets: list[Path]) -> list[Path]:
    removed: list[Path] = []
    for folder in targets:
        if folder.is_symlink():
            # Remove the link itself, never what it points to (a clone may plant one anywhere).
            folder.unlink()
            removed.append(folder)
        elif folder.is_dir():
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def gc(settings: Settings | None = None) -> tuple[int, int]:
    """Drop cache entries and objects that no artifact folder's manifest refers to.

    Returns (files removed, bytes freed).
    """
    settings = settings or Settings()
    cache = settings.cache()
    keep_keys: set[str] = set()
    keep_objects: set[str] = set()
    root = settings.artifacts_dir
    for manifest in sorted(root.glob("*/manifest.json")) if root.is_dir() else []:
        for key, shas in _manifest_refs(manifest):
            if key:
                keep_keys.add(key)
            keep_objects.update(shas)
    lock = _take_alone(cache, "gc")
    try:
        return cache.gc(keep_keys, keep_objects)
    finally:
        lock.release()


def _manifest_refs(manifest: Path) -> list[tuple[str | None, list[str]]]:
    """(step key, output digests) of each step a manifest lists; a damaged or odd-shaped
    manifest (it is a file in the work tree) gives what can be read of it, never an error."""
    from onnxbuild._util import read_regular_text

    try:
        data: object = json.loads(read_regular_text(manifest, limit=64 << 20))
    except (OSError, ValueError, RecursionError):
        return []
    steps = data.get("steps") if isinstance(data, dict) else None
    refs: list[tuple[str | None, list[str]]] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        key = step.get("key") if isinstance(step.get("key"), str) else None
        outputs: list[object] = step["outputs"] if isinstance(step.get("outputs"), list) else []
        refs.append((key, [o["sha256"] for o in outputs if isinstance(o, dict) and isinstance(o.get("sha256"), str)]))
    return refs


def verify_cache(settings: Settings | None = None) -> tuple[int, list[str]]:
    """Re-hash every cached output; drop entries whose files are missing or altered."""
    settings = settings or Settings()
    cache = settings.cache()
    lock = _take_alone(cache, "cache verify")
    try:
        return cache.verify()
    finally:
        lock.release()


def verify_remote(settings: Settings) -> tuple[int, list[str]]:
    """Re-read the remote cache's entries and objects; repair from the local cache where it can."""
    if not settings.cache_url:
        raise UsageError(
            "--remote needs a remote cache: --cache-url URL, ONNXBUILD_CACHE_URL or [tool.onnxbuild] cache_url"
        )
    cache = settings.cache()
    cache.ensure_writable()
    assert cache.remote is not None  # Settings.cache sets it whenever cache_url is set
    return cache.remote.verify(cache)


def _tolerance(
    name: Literal["rtol", "atol"], own: Mapping[str, object], validated: ValidateSection | None, default: float
) -> float:
    """A variant's tolerance: its own, else the recipe's validate section's, else the default."""
    value = own[name] if name in own else validated[name] if validated else default
    return float(value) if isinstance(value, (int, float)) else default


def _take_alone(cache: Cache, command: str) -> FileLock:
    """The cache's maintenance lock, exclusively, or a clear error while a build uses the cache."""
    cache.ensure_own()
    lock = cache.maintenance_lock(shared=False)
    if not lock.try_acquire():
        from onnxbuild.errors import CacheError

        raise CacheError(
            f"another onnxbuild is building with the cache {cache.root}; {command} would delete what it is using: "
            "run it again when that build ends"
        )
    return lock


__all__ = [
    "OnnxbuildError",
    "Settings",
    "build",
    "clean",
    "dag",
    "gc",
    "load_recipe",
    "load_recipes",
    "parse_recipe",
    "plan",
    "report",
    "schema_text",
    "show",
    "verify_cache",
]


class MismatchCase(TypedDict):
    """What explain_mismatch compared with what, for its report."""

    recipe: str
    variant: str
    base: str
    candidate: str
    shape: dict[str, int]
    rtol: float
    atol: float
    validation_case: bool


def explain_mismatch(
    path: str | Path,
    variant: str,
    settings: Settings | None = None,
    *,
    file: str | Path | None = None,
    out: str | Path | None = None,
    shape: int = 0,
    left_padding: int = 0,
) -> tuple[Search, MismatchCase]:
    """The first node where a built variant (or ``file`` in its place) parts from the file it
    was made from, at one of the recipe's validation shapes, with the variant's tolerances:
    (``divergence.Search``, what was compared with what)."""
    from onnxbuild.pipeline import variants
    from onnxbuild.recipe.variants import vocab_size
    from onnxbuild.steps.validating.cases import case_seed
    from onnxbuild.steps.validating.divergence import feeds_for, first_divergence
    from onnxbuild.steps.validating.rules import section, tolerances

    settings = settings or Settings()
    recipe = load_recipe(path)
    r = recipe.resolved
    by_name = {v.name: v for v in variants(recipe)}
    if variant not in by_name:
        raise UsageError(f"--variant: {recipe.name} has no variant {variant!r} (it has: {', '.join(by_name)})")
    v = by_name[variant]
    if v.base is None:
        raise UsageError(
            "--variant: model is the export itself; "
            "explain-mismatch compares a variant with the file it was made from (optimized, or a quantize entry)"
        )
    if v.files:
        raise UsageError(
            f"--variant: {variant} is {len(v.files)} files (an encoder and a decoder); "
            "explain-mismatch takes one-file variants"
        )
    base_name = v.base
    folder = settings.artifacts_dir / recipe.name
    reference = folder / by_name[base_name].path
    candidate = Path(file) if file is not None else folder / v.path
    for what, p in (("the base file", reference), ("the variant", candidate)):
        if not p.is_file():
            raise UsageError(f"{what} {p} does not exist: build it first (onnxbuild make {path})")
    validated = section(r)  # None for an ONNX file or graph source: only tolerances of the variant
    own = tolerances(recipe, v)
    shapes = (validated["shapes"] if validated else []) or [{}]
    if not 0 <= shape < len(shapes):
        raise UsageError(f"--shape: {shape} is not one of the recipe's validation shapes (0 to {len(shapes) - 1})")
    sizes = dict(shapes[shape])
    if left_padding:
        length = int(sizes.get("sequence", 1))
        if not 0 < left_padding < length:
            raise UsageError(
                f"--left-padding: {left_padding} must leave a real token in the padded row: "
                f"between 1 and {length - 1} for validate.shapes[{shape}] (sequence {length})"
            )
        sizes = {**sizes, "batch": max(2, int(sizes.get("batch", 1))), "left_padding": left_padding}
    rtol, atol = _tolerance("rtol", own, validated, DEFAULT_RTOL), _tolerance("atol", own, validated, DEFAULT_ATOL)
    out_dir = Path(out) if out is not None else Path("divergence") / f"{recipe.name}-{variant}"
    seed = case_seed(validated, export_kind.required(r), sizes) if validated and recipe.torch_source else None
    # validation's own inputs for that case where it runs one, else seeded alike
    feeds = feeds_for(
        candidate,
        sizes,
        seed=(validated["seed"] if validated else 0) if seed is None else seed,
        vocab=vocab_size(recipe),
    )
    found = first_divergence(reference, candidate, feeds, rtol, atol, out_dir)
    return found, {
        "recipe": recipe.name,
        "variant": variant,
        "base": base_name,
        "candidate": str(candidate),
        "shape": sizes,
        "rtol": rtol,
        "atol": atol,
        "validation_case": seed is not None,
    }


def upgrade_check(paths: Sequence[str | Path], withs: Sequence[str], settings: Settings | None = None) -> Comparison:
    """Build ``paths`` here and in a throwaway environment with ``withs`` installed over this
    one's packages; the Markdown comparison (``upgrade.Comparison``). Nothing built here is
    touched: the other side has its own cache and artifacts under .onnxbuild/upgrade/."""
    import sys

    from onnxbuild.review import upgrade

    settings = settings or Settings()
    recipes = load_recipes(paths, settings)
    here = build(paths, settings)
    before = upgrade.Side("here", upgrade.versions_of(Path(sys.executable)), settings.artifacts_dir, here.ok)
    root = settings.cache_dir.parent / "upgrade"
    python = upgrade.environment(list(withs), root)
    work = python.parent.parent / "build"
    ok, failures = upgrade.build_with(python, [str(p) for p in paths], work)
    after = upgrade.Side("with " + " ".join(withs), upgrade.versions_of(python), work / "artifacts", ok, failures)
    return upgrade.compare(before, after, [r.name for r in recipes])
