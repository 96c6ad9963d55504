"""Step kinds. Each module here exports its :class:`~onnxbuild.spec.StepKind` as ``KIND``
(name, version, packages, plan, run, and what else it says of itself) and a module-level
``run(ctx, spec) -> StepResult``, the entry point a step process calls by the module's name.

Every key of a kind holds a digest of the onnxbuild code its module can reach
(``onnxbuild.engine.codekeys``), so no version number is kept by hand. ``KIND.packages`` lists the
packages whose versions can change the outputs; they are part of the key too. ``KIND.branches``
names code and packages only some recipes reach, left out of the others' keys. ``describe``
copies these into a StepSpec, so the engine runs specs without importing any kind.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from types import ModuleType

from onnxbuild.spec import STEP_KINDS, StepContext, StepInput, StepKind, StepResult, StepSpec

KINDS: dict[str, str] = {kind: f"onnxbuild.steps.{kind}" for kind in STEP_KINDS}

_extra: dict[str, ModuleType] = {}


def step_module(kind: str) -> ModuleType:
    """The module of a kind: its name is the entry point the engine runs a step by."""
    if kind in _extra:
        return _extra[kind]
    return importlib.import_module(KINDS[kind])


def step_kind(kind: str) -> StepKind:
    """What a kind says of itself: its module's ``KIND``."""
    described: StepKind = step_module(kind).KIND
    return described


def kinds() -> tuple[StepKind, ...]:
    """Every kind in the registry, in pipeline order (and any registered at run time after
    them): what the recipe loader asks for its checks."""
    return tuple(step_kind(k) for k in (*STEP_KINDS, *(k for k in _extra if k not in STEP_KINDS)))


def register(kind: str, module: ModuleType) -> None:
    """Add a step kind at run time (used by the engine's own tests for fake steps): a module
    with a ``KIND`` and a ``run``. It must be importable by name for a step process to run it;
    in-process builds find it here."""
    if not isinstance(getattr(module, "KIND", None), StepKind):
        raise TypeError(f"{module.__name__} has no KIND = StepKind(...) to register as {kind!r}")
    _extra[kind] = module
    sys.modules.setdefault(module.__name__, module)


def describe(spec: StepSpec) -> StepSpec:
    """``spec`` with what its kind says of itself: the branches it does not take, its packages,
    whether it runs alone, its entry point and whether its outputs are measured (hardware-bound)."""
    module = step_module(spec.kind)
    kind = step_kind(spec.kind)
    taken = [b for b in kind.branches if b.taken(spec.params)]
    left = [b for b in kind.branches if not b.taken(spec.params)]
    needed = {name for b in taken for name in b.packages}
    unused = {name for b in left for name in b.packages} - needed
    source = spec.params.get("source")
    named = [f"onnxbuild.sources.{k}" for k in source] if isinstance(source, dict) and len(source) == 1 else []
    return replace(
        spec,
        code_also=tuple(named),
        code_stops=tuple(sorted({b.module for b in left if b.module} - {b.module for b in taken})),
        packages=tuple(name for name in kind.packages if name not in unused),
        exclusive=kind.exclusive,
        entry=module.__name__,
        measured=kind.measured(spec.params),
    )


__all__ = [
    "KINDS",
    "StepContext",
    "StepInput",
    "StepKind",
    "StepResult",
    "StepSpec",
    "describe",
    "register",
    "step_kind",
    "step_module",
]
