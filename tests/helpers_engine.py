"""Fake steps and small helpers for the engine's tests.

This module is itself a step kind (``KIND = StepKind(...)`` and ``run``): tests register it
with ``onnxbuild.steps.register("fake", helpers_engine)``. Being importable by name, it
also runs in the spawned process of a multi-process build. What a fake step does is
set by its params:

- ``text``: what it writes (default: its name), followed by the text of its inputs;
  any other param (say ``note``) changes its key but not its bytes;
- ``sleep``: seconds to sleep first; ``fail``: raise ``StepError`` with this message;
- ``interrupt``: raise ``KeyboardInterrupt`` (Ctrl-C in an in-process build);
- ``skip_outputs``: declared outputs it does not write (a buggy step).

Its ``data`` records its process id and when it started and ended, so tests can tell
whether two steps ran at the same time; its parent's id, whether torch was imported before it
ran, and ``ONNXBUILD_TEST_MARK`` from its environment tell how its process was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import onnxbuild.engine.graph as graph
from onnxbuild.engine.cache import Cache
from onnxbuild.engine.graph import Plan, PlannedStep
from onnxbuild.engine.manifest import StepRecord
from onnxbuild.engine.runner import BuildReport
from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.spec import Planning, StepKind
from onnxbuild.steps import StepContext, StepInput, StepResult, StepSpec, describe, register

NAME = "fake"


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    p = spec.params
    start = time.time()
    made = {"ppid": os.getppid(), "torch": "torch" in sys.modules, "mark": os.environ.get("ONNXBUILD_TEST_MARK")}
    if p.get("interrupt"):
        raise KeyboardInterrupt
    time.sleep(float(p.get("sleep", 0)))
    if p.get("fail"):
        raise StepError(str(p["fail"]))
    parts = [str(p.get("text", spec.name))]
    parts += [ctx.input(i.path).read_text(encoding="utf-8") for i in spec.inputs]
    for out in spec.outputs:
        if out not in p.get("skip_outputs", ()):
            ctx.output(out).write_text("\n".join(parts) + "\n", encoding="utf-8")
    return StepResult(
        summary=f"wrote {spec.name}", data={"pid": os.getpid(), "start": start, "end": time.time(), **made}
    )


def _no_steps(p: Planning) -> list[StepSpec]:
    return []  # fake steps are planned by the tests themselves (fake() below)


KIND = StepKind(name=NAME, packages=(), plan=_no_steps, run=run)


def register_fake() -> None:
    register(NAME, sys.modules[__name__])


def fake(name: str, *deps: str, imports: tuple[str, ...] = (), **params: Any) -> StepSpec:
    """A fake step writing ``<name>.txt`` from the ``<dep>.txt`` of each dependency."""
    return StepSpec(
        name=name,
        kind=NAME,
        params=params,
        imports=imports,
        deps=deps,
        inputs=tuple(StepInput(d, f"{d}.txt") for d in deps),
        outputs=(f"{name}.txt",),
    )


def fake_recipe(name: str, directory: Path) -> Recipe:
    return Recipe(name=name, path=f"recipes/{name}.yaml", directory=directory, digest="0" * 64, resolved={"name": name})


def plan_fakes(
    monkeypatch: pytest.MonkeyPatch, cache: Cache, graphs: dict[str, list[StepSpec]], *, force: bool = False
) -> Plan:
    """Plan recipes named after the keys of ``graphs``, whose steps are its values."""
    recipes = [fake_recipe(name, cache.root.parent) for name in graphs]
    return graph.plan(recipes, cache, lambda recipe: [describe(s) for s in graphs[recipe.name]], force=force)


class Recorder:
    """A reporter that keeps what it is told."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[tuple[str, str]] = []
        self.warnings: list[str] = []

    def step_started(self, step: PlannedStep) -> None:
        self.started.append(step.label)

    def step_finished(self, step: PlannedStep, record: StepRecord, seconds: float) -> None:
        self.finished.append((step.label, record["status"]))

    def warning(self, message: str) -> None:
        self.warnings.append(message)


def outcomes(report: BuildReport) -> dict[str, tuple[str, str]]:
    """``recipe:step`` -> (status, reason) for every step of a build."""
    return {f"{r.recipe.name}:{s['name']}": (s["status"], s["reason"]) for r in report.recipes for s in r.steps}


def reasons(plan: Plan) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``recipe:step`` -> (action, reasons) for every step of a plan."""
    return {s.label: (s.action, s.reasons) for s in plan.steps}


def built(report: BuildReport) -> set[str]:
    return {label for label, (status, _) in outcomes(report).items() if status == "built"}


def step_data(report: BuildReport, label: str) -> dict[str, Any]:
    recipe, name = label.split(":")
    r = next(r for r in report.recipes if r.recipe.name == recipe)
    data: dict[str, Any] = next(s["data"] for s in r.steps if s["name"] == name)
    return data


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(*roots: Path) -> list[Path]:
    """Temporary files anywhere under ``roots`` (what an interrupted atomic write leaves)."""
    return sorted(p for root in roots if root.exists() for p in root.rglob("*.tmp"))


def entry_files(cache_root: Path) -> list[Path]:
    return sorted((cache_root / "entries").glob("*/*.json"))


def whole_entries(cache_root: Path) -> list[dict[str, Any]]:
    """Every cache entry, each checked by ``Cache.get``; fails on a damaged one."""
    messages: list[str] = []
    cache = Cache(cache_root, warn=messages.append)
    entries = [cache.get(p.stem) for p in entry_files(cache_root)]
    assert messages == []
    assert all(e is not None for e in entries)
    return [dict(e) for e in entries if e is not None]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def scratch_dirs(cache_root: Path) -> list[Path]:
    tmp = cache_root / "tmp"
    return sorted(tmp.iterdir()) if tmp.is_dir() else []
