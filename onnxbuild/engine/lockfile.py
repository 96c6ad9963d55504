"""``<recipe>.lock.json``: the step keys and output digests of a recipe's last good build.

Committed beside the recipe, it makes a pull request that changes a recipe show what
that does to the artifacts, and lets CI assert that the lock is current without
building anything (``onnxbuild plan --check``): every key can be recomputed from the
recipe and the lock alone, because each step's inputs are named by the digests the
lock records for the steps before it. Sorted, with no times or paths, so it merges
cleanly and is identical on every machine with the same package versions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onnxbuild._util import pretty_json, write_if_changed
from onnxbuild.engine.cache import Cache, step_key
from onnxbuild.engine.manifest import StepRecord
from onnxbuild.recipe.model import Recipe

LOCK_VERSION = 1


def lock_path(recipe: Recipe) -> Path:
    return recipe.directory / f"{Path(recipe.path).stem}.lock.json"


def write_lock(recipe: Recipe, steps: list[StepRecord]) -> Path:
    """Write the lock of a successful build (only if its content changed)."""
    data = {
        "lock_version": LOCK_VERSION,
        "name": recipe.name,
        "steps": {
            s["name"]: {"key": s["key"], "outputs": {o["path"]: o["sha256"] for o in s["outputs"]}}
            for s in steps
            if s["status"] in ("built", "cached")
        },
    }
    path = lock_path(recipe)
    write_if_changed(path, pretty_json(data))
    return path


def check_lock(recipe: Recipe, cache: Cache) -> list[str]:
    """What differs between the recipe and its lock, in words; empty when the lock is current."""
    from onnxbuild.engine.graph import explain, ingredients
    from onnxbuild.pipeline import steps_for

    path = lock_path(recipe)
    try:
        lock: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        locked: dict[str, Any] = lock["steps"]
    except FileNotFoundError:
        return [f"{path} does not exist; run `onnxbuild make {recipe.path} --lock` and commit it"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{path} cannot be read ({exc}); rebuild it with `onnxbuild make {recipe.path} --lock`"]
    problems: list[str] = []
    last = cache.last_build(recipe.name)
    specs = steps_for(recipe)
    for spec in specs:
        if spec.name not in locked:
            problems.append(f"{recipe.name}:{spec.name}: not in the lock (a new step)")
            continue
        digests: dict[str, str] = {}
        for inp in spec.inputs:
            outputs = locked.get(inp.step, {}).get("outputs", {})
            digests[f"{inp.step}:{inp.path}"] = outputs.get(inp.path, "missing from the lock")
        ing = ingredients(spec, digests, cache)
        key = step_key(ing)
        if key != locked[spec.name]["key"]:
            before = last.get(spec.name) if last.get(spec.name, {}).get("key") == locked[spec.name]["key"] else None
            why = "; ".join(explain(before, ing, key)) if before else "its key differs from the lock's"
            problems.append(f"{recipe.name}:{spec.name}: {why}")
    for name in sorted(set(locked) - {s.name for s in specs}):
        problems.append(f"{recipe.name}:{name}: in the lock but no longer a step of the recipe")
    return problems
