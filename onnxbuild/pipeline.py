"""Which steps a recipe has, what each reads and writes, and what enters each key.

Each step kind plans its own steps (``plan(Planning) -> list[StepSpec]`` in its module);
this module asks every kind, in the registry's order (``spec.STEP_KINDS``), and adds what
the engine needs to place and guard each step. The shape of a build::

    source ──> export ──> check                      (graph / onnx sources: source writes model.onnx)
      │          ├──> optimize ──> quantize.<q>       (variants: optimized/, <q>/; expect.<variant>
      │          │                                    checks each one's graph contract)
      │          │                                    one validate.<variant> per variant,
      └──────────┴──> validate[.<variant>] ──> report  merged into reports/validation.json
                 ├──> generate (with-past decoders: every variant against transformers' generate)
                 └──> benchmark (every variant, beside PyTorch)

``source`` records what the model is (for torch sources: which weights, from where, with
the digests of the local files it names), so the steps after it are keyed by that record;
``export`` writes model.onnx; ``check`` runs the ONNX checker and writes the inspect
report; ``validate`` compares ONNX Runtime with the source model at several shapes.
"""

from __future__ import annotations

from dataclasses import replace

from onnxbuild.engine import testhooks
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.variants import MODEL, SOURCE_RECORD, VARIANT_TOLERANCES, variant
from onnxbuild.sources import recorded, source_kind
from onnxbuild.spec import STEP_KINDS, Limits, Planning, Resources, StepSpec, Variant
from onnxbuild.steps import describe, kinds, step_kind

__all__ = ["MODEL", "SOURCE_RECORD", "VARIANT_TOLERANCES", "Variant", "steps_for", "variants"]


def variants(recipe: Recipe) -> list[Variant]:
    """The exported model, then what each kind makes (its ``KIND.variants(recipe)``), in the
    registry's order."""
    writer = next(k for k in kinds() if k.writes_model(recipe))
    out = [variant(recipe, "model", writer.name, "", writer.model_precision(recipe))]
    for kind in kinds():
        out += kind.variants(recipe, tuple(out))
    return out


def steps_for(recipe: Recipe) -> list[StepSpec]:
    """The recipe's steps in dependency order."""
    if testhooks.tracing_reads():
        recipe = replace(recipe, resolved=testhooks.track(recipe.resolved))
    made = tuple(variants(recipe))
    planning = Planning(recipe, made, made[0].step)
    steps = [spec for kind in STEP_KINDS for spec in step_kind(kind).plan(planning)]
    # What the source record carries (which weights, from where) is in the key of every step
    # that reads the record as an input, so the same recipe keys stay out of those keys.
    carried = recorded(recipe.resolved["source"])
    steps = [
        replace(s, unkeyed=(*s.unkeyed, *carried))
        if carried and "source" in s.params and any(i.path == SOURCE_RECORD for i in s.inputs)
        else s
        for s in steps
    ]
    # A record brings the weights its source step streamed (sources/checkpoint.py) to every step that reads it.
    steps = [
        replace(s, inputs=tuple(replace(i, companions=True) if i.path == SOURCE_RECORD else i for i in s.inputs))
        for s in steps
    ]
    weights = _weight_bytes(recipe)
    model_imports = source_kind(next(iter(recipe.resolved["source"]))).imports
    return [
        describe(
            replace(
                s,
                resources=_resources(recipe, s.kind, weights),
                limits=_limits(recipe, s),
                imports=_imports(s.kind, model_imports),
            )
        )
        for s in steps
    ]


def _imports(kind: str, model_imports: tuple[str, ...]) -> tuple[str, ...]:
    """The heavy modules a step imports: its kind's, and its source's model's when it loads that model."""
    described = step_kind(kind)
    return tuple(dict.fromkeys((*(model_imports if described.loads_model else ()), *described.imports)))


def _limits(recipe: Recipe, spec: StepSpec) -> Limits:
    """The recipe's ``limits``: a step's own entry, else its kind's, else the recipe-wide ones."""
    limits = recipe.resolved.get("limits")
    if not limits:
        return Limits()
    steps = limits.get("steps", {})
    own = steps.get(spec.name) or steps.get(spec.kind)
    if not own:
        return Limits(memory_mb=limits.get("memory_mb"), seconds=limits.get("seconds"))
    return Limits(
        memory_mb=own.get("memory_mb", limits.get("memory_mb")), seconds=own.get("seconds", limits.get("seconds"))
    )


def _resources(recipe: Recipe, kind: str, weights: int) -> Resources:
    """Where a step may run on a cluster: its kind's ``memory`` (peak as a multiple of the
    model's weights plus the interpreter with torch/onnxruntime imported, measured on GPT-2
    small: export 2.8 GB, validate 2.3 GB, benchmark 2.5 GB for 0.5 GB of weights) and its
    ``placement`` (CPUs, GPUs and why) where the kind has one."""
    described = step_kind(kind)
    factor, base = described.memory_for(recipe) if described.memory_for else described.memory
    memory = base + factor * weights // (1024 * 1024)
    cpus, gpus, why = described.placement(recipe)
    basis = f"{factor:g} x the model's {weights / 1e9:.2f} GB of fp32 weights + {base} MB"
    return Resources(cpus=cpus, memory_mb=int(memory), gpus=gpus, why_gpu=why, memory_basis=basis)


def _weight_bytes(recipe: Recipe) -> int:
    """A plan-time estimate of the model's fp32 weights: file sizes where local, else from the config."""
    try:
        return int(source_kind(recipe.source_kind).estimate_weights(recipe.source, recipe.directory))
    except OSError:  # a path the OS refuses; the step that reads it reports that
        return 0
