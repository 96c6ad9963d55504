"""onnxbuild: declarative, cached, reproducible builds of ONNX model artifacts.

Example:
    >>> import onnxbuild
    >>> report = onnxbuild.build(["recipes/linear-regression.yaml"])  # doctest: +SKIP
    >>> report.ok  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild._version import __version__

if TYPE_CHECKING:
    from onnxbuild.api import Settings, build, clean, dag, gc, load_recipe, load_recipes, plan, schema_text, show
    from onnxbuild.errors import (
        BuildFailed,
        CacheError,
        OnnxbuildError,
        RecipeError,
        StepError,
        UsageError,
    )

# Names load on first use (PEP 562): `python -m onnxbuild` and the console script must be able
# to install their signal handlers before anything slow is imported, so a Ctrl-C or SIGTERM
# that lands during start-up still ends with exit 130 and no traceback.
_HOME = {
    **dict.fromkeys(
        ("Settings", "build", "clean", "dag", "gc", "load_recipe", "load_recipes", "plan", "schema_text", "show"),
        "onnxbuild.api",
    ),
    **dict.fromkeys(
        ("BuildFailed", "CacheError", "OnnxbuildError", "RecipeError", "StepError", "UsageError"), "onnxbuild.errors"
    ),
}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module 'onnxbuild' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "BuildFailed",
    "CacheError",
    "OnnxbuildError",
    "RecipeError",
    "Settings",
    "StepError",
    "UsageError",
    "__version__",
    "build",
    "clean",
    "dag",
    "gc",
    "load_recipe",
    "load_recipes",
    "plan",
    "schema_text",
    "show",
]
