"""Whether an artifact folder still holds what its current steps wrote.

``plan`` reports a folder out of step with the cache (a file deleted, edited or replaced
since the last build) so that "everything is up to date" is never said of a folder a
reviewer cannot trust; ``make`` restores such files from the cache.
"""

from __future__ import annotations

from pathlib import Path

from onnxbuild.engine.cache import Cache
from onnxbuild.engine.graph import Plan


def out_of_step(plan: Plan, artifacts_root: Path, cache: Cache) -> list[str]:
    """One line per file of a current (cached) step that is missing or differs in the folder."""
    lines: list[str] = []
    for recipe in plan.recipes:
        folder = artifacts_root / recipe.name
        shown = folder.as_posix()
        for step in plan.steps:
            if step.recipe is not recipe or step.action != "cached" or step.entry is None:
                continue
            for o in step.entry["outputs"]:
                path = folder / o["path"]
                try:
                    if path.is_symlink() or not path.is_file():
                        state = "missing" if not path.exists() and not path.is_symlink() else "not a regular file"
                    elif path.stat().st_size != o["bytes"] or cache.file_digest(path) != o["sha256"]:
                        state = "differs from what step " + step.spec.name + " built"
                    else:
                        continue
                except OSError as exc:
                    state = f"unreadable ({exc.strerror})"
                lines.append(f"{shown}/{o['path']}: {state}; `onnxbuild make {recipe.path}` restores it from the cache")
    return lines
