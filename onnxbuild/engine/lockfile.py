"""``<recipe>.lock.json``: the step keys and output digests of a recipe's last good build.

Committed beside the recipe, it makes a pull request that changes a recipe show what
that does to the artifacts, and lets CI assert that the lock is current without
building anything (``onnxbuild plan --check``): every key can be recomputed from the
recipe and the lock alone, because each step's inputs are named by the digests the
lock records for the steps before it. Sorted, with no times or paths, so it merges
cleanly and is identical on every machine with the same package versions.

Version 2 keeps each step's ingredients too (its resolved section, package versions, the
digests of the files and inputs it reads), so ``plan --check`` explains a stale lock in
words from the lock alone, on a runner with an empty cache. Steps whose outputs are
measurements (benchmarks) or tied to the CPU (optimize at extended levels and above) list
their output paths without digests and are marked ``measured``: locking again never
changes them. ``make --frozen`` holds every other output, built or pulled, to the lock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict, cast

from onnxbuild._util import pretty_json, write_if_changed
from onnxbuild.engine.cache import Cache, step_key
from onnxbuild.engine.manifest import StepRecord
from onnxbuild.recipe.model import Recipe
from onnxbuild.spec import StepSpec

LOCK_VERSION = 2


class LockStep(TypedDict, total=False):
    """One step in a lock, as ``write_lock`` writes it: digests by path, or just the paths where measured."""

    key: str
    ingredients: dict[str, object] | None
    outputs: dict[str, str] | list[str]
    measured: bool
    record: dict[str, object]


def lock_path(recipe: Recipe) -> Path:
    return recipe.directory / f"{Path(recipe.path).stem}.lock.json"


def write_lock(recipe: Recipe, steps: list[StepRecord], cache: Cache, specs: list[StepSpec]) -> Path:
    """Write the lock of a successful build (only if its content changed). ``specs`` are the
    recipe's steps: those whose outputs are measured (hardware-bound) are locked without digests."""
    measured = {s.name for s in specs if s.measured}
    entries: dict[str, dict[str, object]] = {}
    for s in steps:
        if s["status"] not in ("built", "cached") or s["key"] is None:
            continue
        entry = cache.get(s["key"])
        step: dict[str, object] = {"key": s["key"], "ingredients": entry["ingredients"] if entry else None}
        if s["name"] in measured:
            step["measured"] = True
            step["outputs"] = sorted(o["path"] for o in s["outputs"])
        else:
            step["outputs"] = {o["path"]: o["sha256"] for o in s["outputs"]}
        if isinstance(s["data"].get("lock"), dict):  # what the step asks a review to see (a per-layer precision plan)
            step["record"] = s["data"]["lock"]
        entries[s["name"]] = step
    data = {"lock_version": LOCK_VERSION, "name": recipe.name, "steps": entries}
    path = lock_path(recipe)
    write_if_changed(path, pretty_json(data))
    return path


def read_lock(recipe: Recipe) -> dict[str, LockStep]:
    """The lock's steps; raises OSError or ValueError when it is missing or not a lock."""
    path = lock_path(recipe)
    lock = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(lock, dict) or not isinstance(lock.get("steps"), dict):
        raise ValueError("not an onnxbuild lock")
    if lock.get("lock_version") != LOCK_VERSION:
        raise ValueError(f"lock_version {lock.get('lock_version')} (this onnxbuild writes {LOCK_VERSION})")
    # onnxbuild wrote it (write_lock), so its steps are taken as written; the cast checks nothing, so a
    # hand-edited step of another shape is skipped or fails where it is read, as before
    return cast("dict[str, LockStep]", lock["steps"])


def expected_outputs(recipe: Recipe, locked: dict[str, LockStep]) -> dict[str, dict[str, str]]:
    """Step label -> {output path: sha256} for every step the lock holds to its digests."""
    return {
        f"{recipe.name}:{name}": dict(outputs)
        for name, step in locked.items()
        if isinstance(step, dict) and isinstance(outputs := step.get("outputs"), dict)
    }


def check_lock(recipe: Recipe, cache: Cache, specs: list[StepSpec]) -> list[str]:
    """What differs between the recipe (its steps: ``specs``) and its lock, in words; empty when the lock is current."""
    from onnxbuild.engine.graph import MEASURED_BY, explain, ingredients

    path = lock_path(recipe)
    try:
        locked = read_lock(recipe)
    except FileNotFoundError:
        return [f"{path} does not exist; run `onnxbuild make {recipe.path} --lock` and commit it"]
    except (OSError, ValueError) as exc:
        return [f"{path} cannot be read ({exc}); rebuild it with `onnxbuild make {recipe.path} --lock`"]
    problems: list[str] = []
    for spec in specs:
        if spec.name not in locked:
            problems.append(f"{recipe.name}:{spec.name}: not in the lock (a new step)")
            continue
        digests: dict[str, str] = {}
        for inp in spec.inputs:
            outputs = locked.get(inp.step, {}).get("outputs", {})
            if locked.get(inp.step, {}).get("measured"):  # keyed by the step that measured it (graph.input_digests)
                digests[f"{inp.step}:{inp.path}"] = MEASURED_BY + str(locked[inp.step].get("key"))
            else:
                digests[f"{inp.step}:{inp.path}"] = (
                    outputs.get(inp.path, "missing from the lock")
                    if isinstance(outputs, dict)
                    else "measured, not locked"
                )
        ing = ingredients(spec, digests, cache)
        key = step_key(ing)
        mine = locked[spec.name] if isinstance(locked[spec.name], dict) else {}
        if key != mine.get("key"):
            # the lock's own ingredients say what changed, with no cache needed
            why = "; ".join(explain({"key": mine.get("key"), "ingredients": mine.get("ingredients")}, ing, key))
            problems.append(f"{recipe.name}:{spec.name}: {why}")
    for name in sorted(set(locked) - {s.name for s in specs}):
        problems.append(f"{recipe.name}:{name}: in the lock but no longer a step of the recipe")
    return problems
