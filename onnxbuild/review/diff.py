"""``onnxbuild diff``: what a recipe change does, for review in a pull request.

For each recipe changed between a git ref and the working tree: a key-by-key diff of
the *resolved* recipes (so a changed default shows too), the steps the change
invalidates, and, where both sides were built (their entries are in the cache), the
change in validation and benchmark figures and in file sizes.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

from onnxbuild._util import MISSING
from onnxbuild.errors import RecipeError, UsageError
from onnxbuild.recipe.model import Recipe
from onnxbuild.report import diffview
from onnxbuild.report.diffview import Cost, Metric, RecipeDiff
from onnxbuild.review.modeldiff import model_diffs
from onnxbuild.steps.benchmarking import section as benchmarks
from onnxbuild.steps.quantize import METHOD_KEYS

if TYPE_CHECKING:
    from onnxbuild.engine.cache import Cache
    from onnxbuild.engine.graph import Plan, PlannedStep
    from onnxbuild.report.benchmark import BenchmarkReport
    from onnxbuild.report.validation import ValidationReport

__all__ = ["Cost", "Metric", "RecipeDiff", "diff", "render"]


def _git(*args: str, cwd: Path) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise UsageError("onnxbuild diff needs git on PATH") from None
    except subprocess.CalledProcessError as exc:
        raise UsageError(f"git {' '.join(args)} failed: {exc.stderr.strip() or exc}") from None
    return done.stdout


def default_base(cwd: Path) -> str:
    for branch in ("main", "origin/main", "master"):
        try:
            return _git("merge-base", "HEAD", branch, cwd=cwd).strip()
        except UsageError:
            continue
    # Comparing with HEAD instead would show nothing and look like "no change".
    raise UsageError(
        "no base to compare with (no merge-base with main, origin/main or master; a shallow clone?): pass --base REF, "
        "after `git fetch origin REF` if need be"
    )


def renames(base: str, cwd: Path) -> dict[str, str]:
    """Recipes git sees as renamed since ``base``: new path -> old path (relative to the repository)."""
    out: dict[str, str] = {}
    for line in _git("diff", "--name-status", "-M", base, "--", "recipes", cwd=cwd).splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].startswith("R"):
            out[parts[2]] = parts[1]
    return out


def changed_recipes(base: str, cwd: Path) -> list[str]:
    """Recipes under recipes/ changed since ``base``; those whose code files changed (a
    factory or dataset edit rebuilds as surely as a recipe edit); those whose lock changed
    or whose base lock names package versions other than this environment's (a bump)."""
    names = _git("diff", "--name-only", base, "--", "recipes", cwd=cwd).splitlines()
    names += _git("ls-files", "--others", "--exclude-standard", "--", "recipes", cwd=cwd).splitlines()
    recipes = {n for n in names if n.endswith((".yaml", ".yml"))}
    locks = {n.removesuffix(".lock.json") for n in names if n.endswith(".lock.json")}
    code = {
        n
        for n in _git("diff", "--name-only", base, cwd=cwd).splitlines()
        if not n.endswith((".yaml", ".yml", ".lock.json"))
    }
    from onnxbuild.api import load_recipe
    from onnxbuild.pipeline import steps_for

    root = Path(_git("rev-parse", "--show-toplevel", cwd=cwd).strip())
    for path in sorted((cwd / "recipes").glob("*.y*ml")):
        rel = path.relative_to(cwd).as_posix()
        if rel in recipes:
            continue
        if rel.rsplit(".", 1)[0] in locks:
            recipes.add(rel)
            continue
        try:
            recipe = load_recipe(path)
        except RecipeError:
            continue
        reads = {Path(f).resolve() for spec in steps_for(recipe) for f in spec.files.values()}
        if any((root / c).resolve() in reads for c in code) or _package_changes(recipe, base, root)[0]:
            recipes.add(rel)
    return sorted(recipes)


def _load(text: str | None, path: str, cwd: Path) -> Recipe | None:
    from onnxbuild._util import sha256_text
    from onnxbuild.api import parse_recipe

    if text is None:
        return None
    resolved = parse_recipe(text, path)
    return Recipe(
        name=resolved["name"],
        path=path,
        directory=(cwd / path).resolve().parent,
        digest=sha256_text(text),
        resolved=resolved,
    )


def _git_bytes(*args: str, cwd: Path) -> bytes | None:
    """A git command's output as bytes (a file at a commit), or None when git says no."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None
    return done.stdout


def _file_changes(old: Recipe, new: Recipe, base: str, root: Path) -> tuple[list[tuple[str, object, object]], set[str]]:
    """Files a step reads (a factory, a dataset, a checkpoint) that differ between the base and
    the working tree, as changes, and the labels that changed. They are in the steps' keys,
    so a diff that left them out would say "no change" while `plan` rebuilds."""
    import hashlib

    from onnxbuild.pipeline import steps_for

    rows: list[tuple[str, object, object]] = []
    changed: set[str] = set()
    seen: set[str] = set()
    for spec in steps_for(new):
        for label, path in sorted(spec.files.items()):
            if label in seen:
                continue
            seen.add(label)
            try:
                rel = Path(path).resolve().relative_to(root).as_posix()
            except ValueError:
                continue  # an installed module: its version is the package's
            now_path = root / rel
            now = hashlib.sha256(now_path.read_bytes()).hexdigest() if now_path.is_file() else None
            before_bytes = _git_bytes("show", f"{base}:{rel}", cwd=root)
            before = hashlib.sha256(before_bytes).hexdigest() if before_bytes is not None else None
            if now != before:
                changed.add(label)
                rows.append(
                    (
                        f"{label} ({rel})",
                        f"sha256 {before[:12]}" if before else "(absent)",
                        f"sha256 {now[:12]}" if now else "(absent)",
                    )
                )
    return rows, changed


def _at_base(old: Recipe, new: Recipe, base: str, root: Path, folder: Path) -> Recipe:
    """The base recipe reading the base's versions of the files its steps read, copied from
    git into ``folder`` at their places relative to the repository (absent ones stay absent)."""
    from dataclasses import replace

    from onnxbuild.pipeline import steps_for

    for spec in steps_for(new):
        for path in spec.files.values():
            try:
                rel = Path(path).resolve().relative_to(root).as_posix()
            except ValueError:
                continue
            data = _git_bytes("show", f"{base}:{rel}", cwd=root)
            if data is not None:
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_bytes(data)
    directory = folder / new.directory.resolve().relative_to(root)
    directory.mkdir(parents=True, exist_ok=True)
    return replace(old, directory=directory)


def _package_changes(new: Recipe, base: str, root: Path) -> tuple[list[tuple[str, object, object]], set[str]]:
    """Package versions the base's committed lock records that differ from this environment's."""
    from onnxbuild.engine.lockfile import lock_path
    from onnxbuild.environment import package_version

    try:
        rel = lock_path(new).resolve().relative_to(root).as_posix()
    except ValueError:
        return [], set()
    text = _git_bytes("show", f"{base}:{rel}", cwd=root)
    try:
        steps = json.loads(text or b"")["steps"]
    except (ValueError, KeyError, TypeError):
        return [], set()
    before: dict[str, str] = {}
    for step in steps.values() if isinstance(steps, dict) else []:
        packages = (step.get("ingredients") or {}).get("packages") if isinstance(step, dict) else None
        if isinstance(packages, dict):
            before.update({str(k): str(v) for k, v in packages.items()})
    rows: list[tuple[str, object, object]] = [
        (f"package {name}", old, package_version(name))
        for name, old in sorted(before.items())
        if package_version(name) != old
    ]
    return rows, {str(r[0]).removeprefix("package ") for r in rows}


def diff(paths: list[str], base: str | None, cache: Cache, cwd: Path | None = None) -> tuple[str, list[RecipeDiff]]:
    """Each recipe as the base commit has it against the working tree. ``cache`` (with its
    remote, if any) supplies the figures of both sides where their steps were built."""
    from onnxbuild._util import json_changes
    from onnxbuild.engine.graph import plan
    from onnxbuild.pipeline import steps_for

    cwd = cwd or Path.cwd()
    root = Path(_git("rev-parse", "--show-toplevel", cwd=cwd).strip())
    base = base or default_base(cwd)
    if base != "HEAD":
        try:
            _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", cwd=cwd)
        except UsageError:
            raise UsageError(
                f"the base {base!r} is not a commit here (a shallow clone? fetch it: "
                f"git fetch --depth=50 origin {base})"
            ) from None
    paths = paths or changed_recipes(base, cwd)
    moved = renames(base, cwd)
    moved_from = set(moved.values())
    out: list[RecipeDiff] = []
    for path in paths:
        try:
            rel = (cwd / path).resolve().relative_to(root).as_posix()
        except ValueError:
            raise UsageError(f"{path} is outside the git repository at {root}; diff compares recipes in it") from None
        if not (cwd / path).exists():
            try:
                _git("cat-file", "-e", f"{base}:{rel}", cwd=root)
            except UsageError:
                raise UsageError(f"{path}: no such recipe here or at {base[:12]}") from None
        if rel in moved_from and not (cwd / path).exists():
            continue  # shown under its new name
        try:
            old_text: str | None = _git("show", f"{base}:{moved.get(rel, rel)}", cwd=root)
        except UsageError:
            old_text = None
        new_file = cwd / path
        new_text = new_file.read_text(encoding="utf-8") if new_file.is_file() else None
        entry = RecipeDiff(path, "changed")
        try:
            old, new = _load(old_text, path, cwd), _load(new_text, path, cwd)
        except RecipeError as exc:
            entry.status, entry.error = "invalid", str(exc)
            out.append(entry)
            continue
        if old is None and new is None:
            continue
        if old is None or new is None:
            entry.status = "added" if old is None else "deleted"
            entry.invalidated = [s.name for s in steps_for(new or old)]  # type: ignore[arg-type]
            if new is not None:
                entry.cost = Cost.of(plan([new], cache, steps_for), cache)
            out.append(entry)
            continue
        if rel in moved:
            entry.status = f"renamed from {moved[rel]}"
        entry.changes = _expand(json_changes(old.resolved, new.resolved))
        files, changed_files = _file_changes(old, new, base, root)
        packages, changed_packages = _package_changes(new, base, root)
        entry.changes += files + packages
        if not entry.changes and rel not in moved:
            entry.status = "unchanged"
        scratch = tempfile.TemporaryDirectory(prefix="onnxbuild-diff-base-")
        if changed_files:
            # The base side's keys hold the base's factory, not the one on disk now.
            old = _at_base(old, new, base, root, Path(scratch.name))
        old_steps = {s.name: s for s in steps_for(old)}
        dirty: set[str] = set()
        for s in steps_for(new):
            before = old_steps.get(s.name)
            reads = set(s.files) & changed_files or set(s.packages) & changed_packages
            if (
                before is None
                or before.params != s.params
                or before.kind != s.kind
                or reads
                or any(d in dirty for d in s.deps)
            ):
                dirty.add(s.name)
                entry.invalidated.append(s.name)
        old_plan, new_plan = plan([old], cache, steps_for), plan([new], cache, steps_for)
        entry.cost = Cost.of(new_plan, cache)
        entry.metrics = _metrics(old_plan, new_plan, cache)
        entry.models = model_diffs(old_plan, new_plan, cache, new.resolved)
        scratch.cleanup()
        if not entry.metrics:
            both = any(st.entry for st in old_plan.steps) and any(st.entry for st in new_plan.steps)
            entry.figures = "unchanged" if both else "not built on one side (build both, or share a remote cache)"
        out.append(entry)
    return base, out


def _read_output(cache: Cache, step: PlannedStep | None, rel: str) -> object:
    """A report one of our steps wrote (validation.json, benchmark.json), or None."""
    if step is None or step.entry is None:
        return None
    for o in step.entry["outputs"]:
        if o["path"] == rel:
            try:
                return json.loads(cache.object_path(o["sha256"]).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
    return None


def _metrics(old_plan: Plan, new_plan: Plan, cache: Cache) -> list[Metric]:
    """Figures present on both sides (their steps cached), and variants new on one side."""
    rows: list[Metric] = []
    old = {s.spec.name: s for s in old_plan.steps}
    new = {s.spec.name: s for s in new_plan.steps}
    for name, step in new.items():
        before = old.get(name)
        if step.entry is None or before is None or before.entry is None:
            continue
        sizes_old = {o["path"]: o["bytes"] for o in before.entry["outputs"] if o["path"].endswith(".onnx")}
        for o in step.entry["outputs"]:
            if o["path"] in sizes_old and sizes_old[o["path"]] != o["bytes"]:
                rows.append(Metric(f"{o['path']} size", sizes_old[o["path"]], o["bytes"], "bytes"))
    # our report and benchmark steps wrote these objects, in the shapes their TypedDicts name
    # (the benchmark's checked against its JSON schema first); an entry's object is trusted
    # as the cache trusts it
    v_old = cast("ValidationReport | None", _read_output(cache, old.get("report"), "reports/validation.json"))
    v_new = cast("ValidationReport | None", _read_output(cache, new.get("report"), "reports/validation.json"))
    if v_old and v_new:
        for variant, v in v_new["variants"].items():
            w = v_old["variants"].get(variant)
            b = max((c["max_abs_diff"] or 0) for s in v["shapes"] for c in s["outputs"].values())
            if w is None:
                rows.append(Metric(f"validation {variant} max abs diff (new variant)", None, b, ""))
                continue
            a = max((c["max_abs_diff"] or 0) for s in w["shapes"] for c in s["outputs"].values())
            if a != b:
                rows.append(Metric(f"validation {variant} max abs diff", a, b, ""))
            # quality on real text (validate.text): what a reviewer of a quantization change reads
            t_old, t_new = w.get("text"), v.get("text")
            if t_new is not None:
                for label, was, now in (
                    ("perplexity", t_old["perplexity"] if t_old else None, t_new["perplexity"]),
                    ("mean KL from PyTorch", t_old["kld_mean"] if t_old else None, t_new["kld_mean"]),
                    ("top-1 on text", t_old["top1_agreement"] if t_old else None, t_new["top1_agreement"]),
                ):
                    if was != now:
                        rows.append(Metric(f"validation {variant} {label}", was, now, ""))
    b_old = cast("BenchmarkReport | None", _read_output(cache, old.get(benchmarks.STEP), benchmarks.REPORT))
    b_new = cast("BenchmarkReport | None", _read_output(cache, new.get(benchmarks.STEP), benchmarks.REPORT))
    # the same cached entry on both sides has the same figures; a rerun may time alike
    before, after = old.get(benchmarks.STEP), new.get(benchmarks.STEP)
    rerun = before is not None and after is not None and before.key != after.key
    if b_old and b_new and rerun:
        before_p50 = {
            (r["variant"], r["provider"], json.dumps(r.get("shape"), sort_keys=True)): r.get("p50_ms")
            for r in b_old["results"]
        }
        for r in b_new["results"]:
            k = (r["variant"], r["provider"], json.dumps(r.get("shape"), sort_keys=True))
            if k in before_p50 and before_p50[k] and r.get("p50_ms"):
                shape = ", ".join(f"{d}={n}" for d, n in (r.get("shape") or {}).items())
                rows.append(
                    Metric(
                        f"p50 {r['variant']} on "
                        f"{str(r.get('provider', '')).replace('ExecutionProvider', '')} ({shape})",
                        before_p50[k],
                        r["p50_ms"],
                        "ms",
                    )
                )
    return rows


def _expand(changes: list[tuple[str, object, object]]) -> list[tuple[str, object, object]]:
    """An added or removed section or variant as one line per key it sets, not a cut-off dict."""
    out: list[tuple[str, object, object]] = []
    for key, old, new in changes:
        whole = new if old is MISSING else old if new is MISSING else None
        if isinstance(whole, dict) and key.startswith("quantize[") and whole.get("method") in METHOD_KEYS:
            # a dynamic int8 variant's block_size is a default it never reads: not a line to review
            whole = {k: v for k, v in whole.items() if k in METHOD_KEYS[whole["method"]]}
        if isinstance(whole, dict) and whole:
            for leaf, value in _leaves(whole, key):
                out.append((leaf, MISSING, value) if old is MISSING else (leaf, value, MISSING))
        else:
            out.append((key, old, new))
    return out


def _leaves(value: object, prefix: str) -> list[tuple[str, object]]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [(prefix, value)]


def render(base: str, diffs: list[RecipeDiff], fmt: str) -> str:
    """The diff as ``text``, ``md``, ``json`` or ``html`` (a page for a CI artifact)."""
    if fmt == "html":
        from onnxbuild.report.page import render_diff

        return render_diff(base, diffs)
    return diffview.render(base, diffs, fmt)
