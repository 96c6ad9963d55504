"""onnxbuild: declarative, cached, reproducible builds of ONNX model artifacts.

Example:
    >>> import onnxbuild
    >>> report = onnxbuild.build(["recipes/linear-regression.yaml"])  # doctest: +SKIP
    >>> report.ok  # doctest: +SKIP
    True
"""

from __future__ import annotations

from onnxbuild._version import __version__
from onnxbuild.api import Settings, build, clean, dag, gc, load_recipes, plan, schema_text, show
from onnxbuild.errors import (
    BuildFailed,
    CacheError,
    OnnxbuildError,
    RecipeError,
    StepError,
    UsageError,
)
from onnxbuild.recipe.loader import load_recipe

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
