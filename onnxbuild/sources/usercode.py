"""The one rule for recipe keys that name user code: ``file.py:function`` or ``package.module:function``.

A recipe runs the code it names (a recipe is code, like a Makefile), so the rule is about
what a reader can see, not a sandbox: a file reference is a ``.py`` file in the recipe's
folder or below it, or in the folder above it (a project keeping recipes/ beside its code);
never an absolute path, never further up. Checked when the recipe loads (the form, exit 2)
and again by the step that uses it (the file exists and defines the function).
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable
from pathlib import Path

from onnxbuild.errors import StepError

EXAMPLE = 'e.g. "model.py:build" (relative to the recipe\'s folder) or "package.module:build"'


def split(ref: str) -> tuple[str, str]:
    """``"path/file.py:build"`` -> ``("path/file.py", "build")``."""
    target, _, name = ref.rpartition(":")
    return target, name


def is_file(target: str) -> bool:
    """Whether a reference's target is a file path (else it is an importable module)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def ref_problem(ref: str) -> str | None:
    """What is wrong with the form of a reference, or None; needs no file system."""
    target, name = split(ref)
    if not target or not name:
        return f"must name a function as file.py:function or package.module:function, {EXAMPLE}"
    if not is_file(target):
        return None
    posix = target.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        return f"{target} is an absolute path; name a .py file, {EXAMPLE}"
    if not posix.endswith(".py"):
        return f"{target} is not a Python file; name a .py file, {EXAMPLE}"
    parts = posixpath.normpath(posix).split("/")
    if parts[:2] == ["..", ".."]:
        return f"{target} lies outside the recipe's folder and the folder above it; keep model code beside the recipe"
    return None


def file_path(ref: str, recipe_dir: Path) -> Path | None:
    """The file whose contents identify the code: the .py file, or an importable module's origin."""
    target, _ = split(ref)
    if is_file(target):
        return recipe_dir / target
    import importlib.util

    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def check_defines(ref: str, recipe_dir: Path, key: str) -> None:
    """Fail with the key and the fix when a file reference is missing or does not define its
    function; read with ``ast``, so nothing of the user's code runs at this point."""
    problem = ref_problem(ref)
    if problem:
        raise StepError(f"{key}: {problem}")
    target, name = split(ref)
    if not is_file(target):
        return
    path = recipe_dir / target
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StepError(
            f"{key}: {path} does not exist (paths are relative to the recipe's folder, {recipe_dir})"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StepError(
            f"{key}: cannot read {target} ({getattr(exc, 'strerror', None) or exc}); name a readable .py file"
        ) from None
    try:
        tree = ast.parse(text, filename=target)
    except SyntaxError as exc:
        raise StepError(f"{key}: {target} is not valid Python (line {exc.lineno}: {exc.msg})") from None
    if name not in _top_level_names(tree):
        raise StepError(
            f"{key}: {target} defines no function {name!r} at its top level; "
            f"add `def {name}(...)` there or fix the name after the colon"
        )


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.If, ast.Try)):
            # definitions under `if TYPE_CHECKING` / try-import fallbacks count
            inner = ast.Module(
                body=[
                    *node.body,
                    *getattr(node, "orelse", []),
                    *[s for h in getattr(node, "handlers", []) for s in h.body],
                ],
                type_ignores=[],
            )
            names |= _top_level_names(inner)
    return names


def load_function(ref: str, recipe_dir: Path, key: str) -> Callable[..., object]:
    """Import the function ``ref`` names. ``key`` is the recipe key that holds it, for messages."""
    import importlib
    import importlib.util
    import sys

    from onnxbuild._util import sha256_text

    target, name = split(ref)
    if is_file(target):
        check_defines(ref, recipe_dir, key)
        path = (recipe_dir / target).resolve()
        module_name = f"_onnxbuild_{path.stem}_{sha256_text(str(path))[:12]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise StepError(f"{key}: Python cannot import {target}; name a .py file, {EXAMPLE}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise StepError(f"{key}: importing {target} failed: {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(path.parent))
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise StepError(f"{key}: cannot import {target}: {type(exc).__name__}: {exc}") from None
    fn: object = getattr(module, name, None)
    if not callable(fn):
        raise StepError(f"{key}: {target} has no function {name!r}")
    return fn
