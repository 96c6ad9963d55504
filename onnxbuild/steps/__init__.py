"""Step kinds. Each module exposes ``VERSION``, ``PACKAGES`` and ``run(ctx, spec) -> StepResult``.

``VERSION`` is bumped whenever a change to the module can change its outputs; it is
part of every key of that kind. ``PACKAGES`` lists the packages whose versions can
change the outputs; they are part of the key too, and nothing else is.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from onnxbuild.steps.base import StepContext, StepInput, StepResult, StepSpec

KINDS: dict[str, str] = {
    "source": "onnxbuild.steps.source",
    "check": "onnxbuild.steps.check",
    "export": "onnxbuild.steps.export",
    "validate": "onnxbuild.steps.validate",
    "optimize": "onnxbuild.steps.optimize",
    "quantize": "onnxbuild.steps.quantize",
    "report": "onnxbuild.steps.report",
    "benchmark": "onnxbuild.steps.benchmark",
    "generate": "onnxbuild.steps.generate",
}

_extra: dict[str, ModuleType] = {}


def step_module(kind: str) -> ModuleType:
    if kind in _extra:
        return _extra[kind]
    return importlib.import_module(KINDS[kind])


def register(kind: str, module: ModuleType) -> None:
    """Add a step kind at run time (used by the engine's own tests for fake steps)."""
    _extra[kind] = module


__all__ = ["KINDS", "StepContext", "StepInput", "StepResult", "StepSpec", "register", "step_module"]
