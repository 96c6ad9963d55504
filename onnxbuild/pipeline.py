"""Which steps a recipe has, what each reads and writes, and what enters each key.

This is the one place that knows the shape of a build::

    source ──> export ──> check                      (graph / onnx sources: source writes model.onnx)
      │          ├──> optimize ──> quantize.<q>       (variants: optimized/, <q>/)
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

from dataclasses import dataclass, replace
from typing import Any

from onnxbuild.recipe.model import Recipe
from onnxbuild.sources import source_module
from onnxbuild.spec import Limits, Resources, StepInput, StepSpec
from onnxbuild.steps import describe

MODEL = "model.onnx"
SOURCE_RECORD = "reports/source.json"

# Tolerances per kind of variant, after ONNX Runtime's own GPT-2 parity helpers
# (fp32 5e-4, fp16 0.2, int8 3.0 plus a top-1 match rate): one atol is the wrong gate
# for quantized models, so each kind gets its own, and language models a top-1 floor.
VARIANT_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"atol": 5e-4, "rtol": 1e-3, "top1_min": 0.99, "cosine_min": 0.999},
    "fp16": {"atol": 0.2, "rtol": 0.05, "top1_min": 0.95, "cosine_min": 0.99},
    "int8": {"atol": 3.0, "rtol": 0.5, "top1_min": 0.85, "cosine_min": 0.98},
    "int4": {"atol": 3.0, "rtol": 0.5, "top1_min": 0.80, "cosine_min": 0.97},
}


@dataclass(frozen=True)
class Variant:
    """One ONNX model the build produces: its name, the step that writes it and its path."""

    name: str
    step: str
    path: str
    precision: str


def variants(recipe: Recipe) -> list[Variant]:
    r = recipe.resolved
    base = "export" if recipe.torch_source else "source"
    out = [Variant("model", base, MODEL, "fp32")]
    if r.get("optimize"):
        out.append(Variant("optimized", "optimize", "optimized/model.onnx", "fp16" if r["optimize"]["float16"] else "fp32"))
    for q in r.get("quantize", []):
        out.append(Variant(q["name"], f"quantize.{q['name']}", f"{q['name']}/model.onnx", "int4" if q["method"] == "int4" else "int8"))
    return out


def steps_for(recipe: Recipe) -> list[StepSpec]:
    """The recipe's steps in dependency order."""
    r = recipe.resolved
    kind = recipe.source_kind
    src = recipe.source
    torch_source = recipe.torch_source
    steps: list[StepSpec] = []
    if torch_source:
        files, identity = source_module(kind).identity(src, recipe.directory)
        steps.append(StepSpec(name="source", kind="source", params={"source": r["source"]}, outputs=(SOURCE_RECORD,), files=files, identity=identity))
        steps.append(
            StepSpec(
                name="export",
                kind="export",
                params={"source": r["source"], "export": r["export"]},
                deps=("source",),
                inputs=(StepInput("source", SOURCE_RECORD),),
                outputs=(MODEL, "config.json") if kind == "huggingface" else (MODEL,),
            )
        )
        model_step = "export"
    else:
        files, identity = source_module(kind).identity(src, recipe.directory)
        steps.append(StepSpec(name="source", kind="source", params={"source": r["source"]}, outputs=(MODEL,), files=files, identity=identity))
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
    all_variants = variants(recipe)
    by_name = {v.name: v for v in all_variants}
    # The first ONNX Runtime provider (web is onnxruntime-web, not a provider of this ORT).
    provider = next((p["name"] for p in r["providers"] if p["name"] != "web"), "CPUExecutionProvider")
    web = next((p for p in r["providers"] if p["name"] == "web"), None)
    web_variants = set(web["options"].get("variants") or ["model"]) if web else set()
    if r.get("optimize"):
        from onnxbuild.steps.optimize import HARDWARE_BOUND, cpu_fingerprint

        hardware = r["optimize"]["level"] in HARDWARE_BOUND
        # A decoder with a KV cache may get its graph written from the weights (fusion/decoder.py):
        # then the step reads the model as the source step recorded it.
        fuse = kind == "huggingface" and src.get("task") == "text-generation" and bool(r["export"].get("with_past")) and r["optimize"]["decoder"] != "export"
        steps.append(
            StepSpec(
                name="optimize",
                kind="optimize",
                params={
                    "optimize": r["optimize"], "source": r["source"] if torch_source or kind == "huggingface" else None, "input": MODEL,
                    "provider": provider if hardware else None, **({"fuse_decoder": True} if fuse else {}),
                },
                deps=(model_step, "source") if fuse else (model_step,),
                inputs=(StepInput(model_step, MODEL), StepInput("source", SOURCE_RECORD)) if fuse else (StepInput(model_step, MODEL),),
                outputs=("optimized/model.onnx", "reports/optimize.json"),
                identity={"cpu": cpu_fingerprint()} if hardware else {},
            )
        )
    for q in r.get("quantize", []):
        base = by_name["optimized"] if q["from"] == "optimized" else by_name["model"]
        steps.append(
            StepSpec(
                name=f"quantize.{q['name']}",
                kind="quantize",
                params={
                    "quantize": q,
                    "input": base.path,
                    "inputs": r["export"]["inputs"] if torch_source else [],
                    "shapes": r["validate"]["shapes"] if torch_source else [],
                    "vocab_size": _vocab_size(recipe),
                },
                deps=(base.step,),
                inputs=(StepInput(base.step, base.path),),
                outputs=(f"{q['name']}/model.onnx",),
            )
        )
    if torch_source:
        reports = []
        for v in all_variants:
            name = "validate" if v.name == "model" else f"validate.{v.name}"
            tolerances = _tolerances(recipe, v)
            params = {"source": r["source"], "export": r["export"], "validate": {**r["validate"], **tolerances}, "variant": v.name, "model_path": v.path}
            if v.name in web_variants:
                params["web"] = True  # meant for the browser: validated in onnxruntime-web too
            steps.append(
                StepSpec(
                    name=name,
                    kind="validate",
                    params=params,
                    deps=tuple(dict.fromkeys(("source", v.step))),
                    inputs=(StepInput("source", SOURCE_RECORD), StepInput(v.step, v.path)),
                    outputs=(f"reports/validation/{v.name}.json", f"reports/validation/{v.name}.md"),
                )
            )
            reports.append((name, v.name))
        steps.append(
            StepSpec(
                name="report",
                kind="report",
                params={"variants": [v for _, v in reports]},
                deps=tuple(n for n, _ in reports),
                inputs=tuple(StepInput(n, f"reports/validation/{v}.json") for n, v in reports),
                outputs=("reports/validation.json", "reports/validation.md"),
            )
        )
    if r.get("generate"):
        steps.append(
            StepSpec(
                name="generate",
                kind="generate",
                params={
                    "generate": r["generate"],
                    "source": r["source"],
                    "variants": [{"name": v.name, "path": v.path, "precision": v.precision} for v in all_variants],
                },
                deps=tuple(dict.fromkeys(["source", *(v.step for v in all_variants)])),
                inputs=(StepInput("source", SOURCE_RECORD), *(StepInput(v.step, v.path) for v in all_variants)),
                outputs=("reports/generation.json", "reports/generation.md"),
            )
        )
    if r.get("benchmark"):
        inputs = [StepInput(v.step, v.path) for v in all_variants]
        if torch_source:
            inputs.insert(0, StepInput("source", SOURCE_RECORD))
        if r.get("export") and r["export"]["with_past"]:
            inputs.append(StepInput("export", "config.json"))
        steps.append(
            StepSpec(
                name="benchmark",
                kind="benchmark",
                params={
                    "benchmark": r["benchmark"],
                    "providers": r["providers"],
                    "source": r["source"],
                    "export": r.get("export"),
                    "variants": [{"name": v.name, "path": v.path, "precision": v.precision} for v in all_variants],
                },
                deps=tuple(dict.fromkeys(i.step for i in inputs)),
                inputs=tuple(inputs),
                outputs=("benchmark.json", "benchmark.md", "benchmark.png"),
                # latencies belong to the machine that measured them: a runner of another
                # kind never pulls them from a shared cache as if they were its own
                identity={"machine": _machine()},
            )
        )
    weights = _weight_bytes(recipe)
    return [describe(replace(s, resources=_resources(recipe, s.kind, weights), limits=_limits(recipe, s))) for s in steps]


def _limits(recipe: Recipe, spec: StepSpec) -> Limits:
    """The recipe's ``limits``: a step's own entry, else its kind's, else the recipe-wide ones."""
    limits = recipe.resolved.get("limits") or {}
    own = limits.get("steps", {}).get(spec.name) or limits.get("steps", {}).get(spec.kind) or {}
    return Limits(memory_mb=own.get("memory_mb", limits.get("memory_mb")), seconds=own.get("seconds", limits.get("seconds")))


# Peak memory of a step as a multiple of the model's weights, plus the interpreter with
# torch/onnxruntime imported; measured on GPT-2 small (weights 0.5 GB: export 2.8 GB,
# validate 2.3 GB, benchmark 2.5 GB). Used only to place steps on a cluster.
_MEMORY = {"source": (0, 300), "check": (2, 300), "export": (5, 600), "validate": (4, 600), "optimize": (4, 400), "quantize": (3, 400), "report": (0, 200), "generate": (4, 600), "benchmark": (5, 600)}


def _resources(recipe: Recipe, kind: str, weights: int) -> Resources:
    r = recipe.resolved
    factor, base = _MEMORY.get(kind, (2, 500))
    memory = base + factor * weights // (1024 * 1024)
    cpus, gpus, why = 1.0, 0, ""
    if kind == "export" and r["export"]["device"] == "cuda":
        gpus, why = 1, "export.device: cuda"
    if kind == "benchmark":
        cpus = float(r["benchmark"]["threads"] or 2)
        if any(p["name"] == "CUDAExecutionProvider" for p in r["providers"]):
            gpus, why = 1, "benchmark on CUDAExecutionProvider"
    return Resources(cpus=cpus, memory_mb=int(memory), gpus=gpus, why_gpu=why)


def _weight_bytes(recipe: Recipe) -> int:
    """A plan-time estimate of the model's fp32 weights: file sizes where local, else from the config."""
    try:
        return _estimate_weights(recipe)
    except OSError:  # a path the OS refuses; the step that reads it reports that
        return 0


def _estimate_weights(recipe: Recipe) -> int:
    return int(source_module(recipe.source_kind).estimate_weights(recipe.source, recipe.directory))


def _tolerances(recipe: Recipe, v: Variant) -> dict[str, Any]:
    """The base validate section's tolerances for the exported model; the variant's own otherwise."""
    r = recipe.resolved
    if v.name == "model":
        return {}
    own = (r["optimize"] or {}).get("validate", {}) if v.name == "optimized" else next(q["validate"] for q in r["quantize"] if q["name"] == v.name)
    defaults = dict(VARIANT_TOLERANCES[v.precision])
    if r["validate"].get("top1_min") is None:
        defaults.pop("top1_min")
    if "cosine_min" not in r["validate"] or r["validate"].get("cosine_min") is None:
        defaults.pop("cosine_min")
    return {**defaults, **own}


def _machine() -> dict[str, Any]:
    import os

    from onnxbuild.environment import cpu_info
    from onnxbuild.steps.optimize import cpu_fingerprint

    return {"cpu": cpu_info()[0], "features": cpu_fingerprint(), "threads": os.cpu_count()}


def _vocab_size(recipe: Recipe) -> int | None:
    if recipe.source_kind != "huggingface":
        return None
    config = recipe.source.get("config") or {}
    size = config.get("vocab_size")
    return int(size) if size else None
