"""Artifact folders: where a recipe's outputs land, the trust checks on the way, and
whether a folder still holds what its current steps wrote.

The cache holds the bytes; ``materialise`` places them under ``artifacts/<name>/`` (a
hard link where it can, a copy where not) without following a link out of the folder,
overwriting a file another build still owns, or leaving a half-written file behind; a
failed step's log and outputs are kept beside the folder for the user to read.
``plan`` reports a folder out of step with the cache (a file deleted, edited or replaced
since the last build) so that "everything is up to date" is never said of a folder a
reviewer cannot trust; ``make`` restores such files from the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import cast

from onnxbuild._util import read_regular_text, sha256_file, temp_owner
from onnxbuild.engine.cache import Cache, OutputRecord, process_alive
from onnxbuild.engine.graph import Plan, PlannedStep
from onnxbuild.engine.manifest import Manifest
from onnxbuild.engine.testhooks import pause_for_tests
from onnxbuild.errors import UsageError


def out_of_step(plan: Plan, artifacts_root: Path, cache: Cache) -> list[str]:
    """One line per file of a current (cached) step that is missing or differs in the folder."""
    lines: list[str] = []
    for recipe in plan.recipes:
        folder = artifacts_root / recipe.name
        shown = folder.as_posix()
        for step in plan.steps:
            if (
                step.recipe is not recipe
                or step.action != "cached"
                or step.entry is None
                or step.key in cache.remote_only
            ):
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


def read_manifest(folder: Path) -> Manifest | None:
    """The folder's manifest.json if it is a readable JSON object with a list of steps, else None."""
    try:
        data = json.loads(read_regular_text(folder / "manifest.json", limit=64 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("steps"), list)
        or not isinstance(data.get("recipe"), dict)
    ):
        return None
    # onnxbuild wrote it (make_manifest); past the checks above the cast checks nothing, so a hand-edited
    # step or output of another shape is skipped or fails where it is read, as before
    return cast("Manifest", data)


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
                    problems.append(
                        f"{shown}: its bytes differ from the manifest's sha256 {o['sha256'][:12]} (edited in place?)"
                    )
            except OSError as exc:
                problems.append(f"{shown}: unreadable ({exc.strerror})")
    return problems


DIVERGENCE = "divergence"
"""The folder of a failed step's outputs where validation leaves the first diverging node's
subgraph: kept beside its reports, whatever the files' types."""


def failed_dir(artifacts_root: Path, p: PlannedStep) -> Path:
    return artifact_folder(artifacts_root, p.recipe.name) / "failed" / p.spec.name


def artifact_folder(artifacts_root: Path, name: str) -> Path:
    """``artifacts_root/name``, refused if it leads elsewhere.

    A cloned repository (or a pull request built in CI) can hold artifacts/<name> as a
    symbolic link to any folder; following it would overwrite files there. The artifacts
    root itself may be a link (say, to a bigger disk): only what lies under it is checked.
    """
    folder = artifacts_root / name
    if not inside(folder, artifacts_root):
        raise UsageError(
            f"{folder} leads to {folder.resolve()}, outside {artifacts_root}/ (a symbolic link?); "
            f"onnxbuild writes artifacts only inside {artifacts_root}/: remove the link, or pass --artifacts-dir"
        )
    return folder


def check_places(folder: Path, paths: list[str]) -> None:
    """Refuse, before anything is built, an artifact folder where a file or folder onnxbuild
    writes is in the way (a folder named model.onnx, a file named reports): it could be the
    user's, so it is never removed."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file where onnxbuild writes the artifact folder; move it away and build again")
    for rel in paths:
        target = folder / rel
        for parent in reversed(target.relative_to(folder).parents):
            place = folder / parent
            if parent != Path(".") and place.exists() and not place.is_dir():
                raise UsageError(
                    f"{place} is a file where onnxbuild needs a folder (for {rel}); move it away and build again"
                )
        if target.is_dir() and not target.is_symlink():
            raise UsageError(f"{target} is a folder where onnxbuild writes a file; move it away and build again")


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, its symbolic links followed, lies under ``root`` (or is it)."""
    return path.resolve().is_relative_to(root.resolve())


def _checked(dest: Path, folder: Path) -> Path:
    """``dest``, a file to be written in ``folder``, refused if its parent leads out of it.

    The file itself may be a link: callers replace or unlink it, never write through it.
    """
    if not inside(dest.parent, folder):
        raise UsageError(
            f"{dest.parent} leads to {dest.parent.resolve()}, outside {folder}/ (a symbolic link?); "
            "onnxbuild writes artifacts only inside it: remove the link"
        )
    return dest


def save_log(workdir: Path, artifacts_root: Path, p: PlannedStep) -> str | None:
    src = workdir / "step.log"
    if not src.exists():
        return None
    dest = _checked(failed_dir(artifacts_root, p) / "step.log", artifacts_root / p.recipe.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)  # copyfile writes through a link; a fresh file cannot be one
    shutil.copyfile(src, dest)
    return str(dest)


def keep_failed_outputs(out: Path, artifacts_root: Path, p: PlannedStep) -> None:
    """A failed step's reports (say, a failed validation) are worth reading; keep them apart from good artifacts."""
    # and the first-divergence search's small subgraph and its inputs (validate)
    kept = (".json", ".md", ".txt")
    files = (
        [
            f
            for f in out.rglob("*")
            if f.is_file()
            and (f.suffix in kept or (DIVERGENCE in f.relative_to(out).parts and f.suffix in (".onnx", ".npz")))
        ]
        if out.is_dir()
        else []
    )
    for f in files:
        dest = _checked(failed_dir(artifacts_root, p) / f.relative_to(out), artifacts_root / p.recipe.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        shutil.copyfile(f, dest)


def link_or_copy(src: Path, dest: Path, *, pause: str = "") -> None:
    """Place ``src`` at ``dest`` atomically: a hard link where possible, else a copy.

    The temporary name carries this process's id, so a later build can tell the leftovers
    of a killed one (see ``remove_stale_temps``).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    if pause:
        pause_for_tests("materialise", pause)
    os.replace(tmp, dest)


def remove_stale_temps(folder: Path) -> None:
    """Delete ``.<file>.<pid>[-<random>].tmp`` left in an artifact folder by a build killed mid-write.

    No reader looks at them, but each is a hard link that keeps a cache object's bytes on
    disk after ``onnxbuild gc``, and a copied (cross-device) one is a whole model.
    """
    if not folder.is_dir():
        return
    for tmp in folder.rglob(".*.tmp"):
        pid = temp_owner(tmp.name)
        if pid is not None and not process_alive(pid):
            with contextlib.suppress(OSError):
                tmp.unlink()


def previous_owners(folder: Path) -> dict[str, str]:
    """Each file the last manifest lists, mapped to the step that wrote it."""
    try:
        data = json.loads(read_regular_text(folder / "manifest.json", limit=64 << 20))
        # A manifest is a file in the work tree, not our word: only text paths are taken.
        return {
            o["path"]: str(s["name"])
            for s in data.get("steps", [])
            for o in s.get("outputs", [])
            if isinstance(o["path"], str)
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return {}


def materialise(cache: Cache, o: OutputRecord, folder: Path, rel: str) -> None:
    dest = _checked(folder / rel, folder)
    src = cache.object_path(o["sha256"])
    try:
        if os.path.samefile(src, dest):
            return
    except OSError:
        pass
    try:
        st = dest.stat()
        if st.st_size == o["bytes"] and cache.file_digest(dest) == o["sha256"]:
            return
    except OSError:
        pass
    if cache.file_digest(src) != o["sha256"]:
        from onnxbuild.errors import CacheError

        raise CacheError(
            f"cache object {o['sha256'][:12]} for {o['path']} is corrupt; run `onnxbuild cache verify`, "
            "then build again"
        )
    link_or_copy(src, dest, pause=rel)
