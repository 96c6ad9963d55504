"""Step kinds. Each module exposes ``VERSION``, ``PACKAGES`` and ``run(ctx, spec) -> StepResult``,
and optionally ``EXCLUSIVE`` (runs alone) and ``measured(params) -> str`` (why its outputs
differ by machine or run, "" when they do not).

``VERSION`` is bumped whenever a change to the module can change its outputs; it is
part of every key of that kind. ``PACKAGES`` lists the packages whose versions can
change the outputs; they are part of the key too, and nothing else is. ``describe``
copies these into a StepSpec, so the engine runs specs without importing any kind.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from types import ModuleType

from onnxbuild.spec import STEP_KINDS, StepContext, StepInput, StepResult, StepSpec

KINDS: dict[str, str] = {kind: f"onnxbuild.steps.{kind}" for kind in STEP_KINDS}

_extra: dict[str, ModuleType] = {}


def step_module(kind: str) -> ModuleType:
    if kind in _extra:
        return _extra[kind]
    return importlib.import_module(KINDS[kind])


def register(kind: str, module: ModuleType) -> None:
    """Add a step kind at run time (used by the engine's own tests for fake steps). Its module
    must be importable by name for a step process to run it; in-process builds find it here."""
    _extra[kind] = module
    sys.modules.setdefault(module.__name__, module)


def describe(spec: StepSpec) -> StepSpec:
    """``spec`` with what its kind says of itself: version, packages, whether it runs alone,
    its entry point and whether its outputs are measured (hardware-bound)."""
    module = step_module(spec.kind)
    why = getattr(module, "measured", None)
    return replace(
        spec,
        version=int(module.VERSION),
        packages=tuple(module.PACKAGES),
        exclusive=bool(getattr(module, "EXCLUSIVE", False)),
        entry=module.__name__,
        measured=why(spec.params) if callable(why) else "",
    )


__all__ = ["KINDS", "StepContext", "StepInput", "StepResult", "StepSpec", "describe", "register", "step_module"]
