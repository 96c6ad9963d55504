"""Whether an artifact folder still holds what its current steps wrote.

``plan`` reports a folder out of step with the cache (a file deleted, edited or replaced
since the last build) so that "everything is up to date" is never said of a folder a
reviewer cannot trust; ``make`` restores such files from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onnxbuild._util import read_regular_text, sha256_file
from onnxbuild.engine.cache import Cache
from onnxbuild.engine.graph import Plan


def out_of_step(plan: Plan, artifacts_root: Path, cache: Cache) -> list[str]:
    """One line per file of a current (cached) step that is missing or differs in the folder."""
    lines: list[str] = []
    for recipe in plan.recipes:
        folder = artifacts_root / recipe.name
        shown = folder.as_posix()
        for step in plan.steps:
            if step.recipe is not recipe or step.action != "cached" or step.entry is None or step.key in cache.remote_only:
                continue  # a step make will pull is counted as such, not as a damaged folder
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


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest.json if it is a readable JSON object with a list of steps, else None."""
    try:
        data = json.loads(read_regular_text(folder / "manifest.json", limit=64 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or not isinstance(data.get("recipe"), dict):
        return None
    return data


def rehash(folder: Path) -> list[str]:
    """Every file the manifest lists, read in full (no stat shortcut), against its digest.

    ``make`` and ``plan`` trust a file whose size and modification time did not change,
    as DVC does; an edit that keeps both (a byte flipped and the mtime restored) is caught
    only here, by ``onnxbuild verify`` and ``onnxbuild plan --check``.
    """
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder.as_posix()}/manifest.json is missing or unreadable"]
    problems: list[str] = []
    for step in manifest["steps"]:
        for o in step.get("outputs", []) if isinstance(step, dict) else []:
            if not isinstance(o, dict) or not isinstance(o.get("path"), str) or not isinstance(o.get("sha256"), str):
                continue
            path = folder / o["path"]
            shown = f"{folder.as_posix()}/{o['path']}"
            try:
                if path.is_symlink() or not path.is_file():
                    problems.append(f"{shown}: missing or not a regular file")
                elif sha256_file(path) != o["sha256"]:
                    problems.append(f"{shown}: its bytes differ from the manifest's sha256 {o['sha256'][:12]} (edited in place?)")
            except OSError as exc:
                problems.append(f"{shown}: unreadable ({exc.strerror})")
    return problems
