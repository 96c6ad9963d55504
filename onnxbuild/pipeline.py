"""Which steps a recipe has, what each reads and writes, and what enters each key.

This is the one place that knows the shape of a build::

    graph / onnx source:          source ──> check

    huggingface / pytorch source: source ──> export ──> check
                                     │          │
                                     └────> validate <┘

``source`` records what the model is (for torch sources: which weights, from where, with
the digests of the local files it names), so the steps after it are keyed by that record;
``export`` writes model.onnx; ``check`` runs the ONNX checker and writes the inspect
report; ``validate`` compares ONNX Runtime with the source model at several shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnxbuild.recipe.model import TORCH_SOURCES, Recipe
from onnxbuild.steps.base import StepInput, StepSpec

MODEL = "model.onnx"
SOURCE_RECORD = "reports/source.json"


def steps_for(recipe: Recipe) -> list[StepSpec]:
    """The recipe's steps in dependency order."""
    r = recipe.resolved
    kind = recipe.source_kind
    src = recipe.source
    steps: list[StepSpec] = []
    if kind in TORCH_SOURCES:
        files, identity = _torch_source_identity(recipe)
        steps.append(StepSpec(name="source", kind="source", params={"source": r["source"]}, outputs=(SOURCE_RECORD,), files=files, identity=identity))
        steps.append(
            StepSpec(
                name="export",
                kind="export",
                params={"source": r["source"], "export": r["export"]},
                deps=("source",),
                inputs=(StepInput("source", SOURCE_RECORD),),
                outputs=(MODEL,),
            )
        )
        model_step = "export"
    else:
        files = {"source.onnx.path": recipe.directory / src["path"]} if kind == "onnx" else {}
        steps.append(StepSpec(name="source", kind="source", params={"source": r["source"]}, outputs=(MODEL,), files=files))
        model_step = "source"
    steps.append(
        StepSpec(
            name="check",
            kind="check",
            params={},
            deps=(model_step,),
            inputs=(StepInput(model_step, MODEL),),
            outputs=("reports/check.json", "reports/check.md"),
        )
    )
    if kind in TORCH_SOURCES:
        steps.append(
            StepSpec(
                name="validate",
                kind="validate",
                params={"source": r["source"], "export": r["export"], "validate": r["validate"], "variant": "model"},
                deps=("source", "export"),
                inputs=(StepInput("source", SOURCE_RECORD), StepInput("export", MODEL)),
                outputs=("reports/validation.json", "reports/validation.md"),
            )
        )
    return steps


def _torch_source_identity(recipe: Recipe) -> tuple[dict[str, Path], dict[str, Any]]:
    """Local files whose contents identify the model, and identity facts found without a network."""
    src = recipe.source
    if recipe.source_kind == "pytorch":
        from onnxbuild.sources.pytorch import factory_files

        return factory_files(src, recipe.directory), {}
    from onnxbuild.sources.huggingface import plan_identity

    return plan_identity(src, recipe.directory)
