"""The ONNX models a recipe builds (its variants), where each lands, and the tolerances
each kind of variant is validated with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxbuild.recipe.model import Recipe

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
    files: tuple[str, ...] = ()
    """Every ONNX file of the variant when it is more than one (an encoder-decoder's
    encoder_model.onnx and decoder_model.onnx); ``path`` is then the decoder's."""

    @property
    def paths(self) -> tuple[str, ...]:
        return self.files or (self.path,)

    @property
    def validate_step(self) -> str:
        """The step that validates it: ``validate`` for the exported model, ``validate.<name>`` else."""
        return "validate" if self.name == "model" else f"validate.{self.name}"

    def as_param(self) -> dict[str, Any]:
        """How a step's params name it (generate, benchmark)."""
        return {"name": self.name, "path": self.path, "precision": self.precision, **({"files": list(self.files)} if self.files else {})}


def model_files(recipe: Recipe) -> tuple[str, ...]:
    """The ONNX files of the exported model: model.onnx, or the source kind's several files."""
    from onnxbuild.sources import source_module

    kind_files = getattr(source_module(recipe.source_kind), "files", None)
    return tuple(kind_files(recipe.source)) if kind_files is not None and recipe.torch_source else (MODEL,)


def variants(recipe: Recipe) -> list[Variant]:
    r = recipe.resolved
    base = "export" if recipe.torch_source else "source"
    names = model_files(recipe)

    def variant(name: str, step: str, folder: str, precision: str) -> Variant:
        files = tuple(f"{folder}{n}" for n in names)
        return Variant(name, step, files[-1], precision, files if len(files) > 1 else ())

    out = [variant("model", base, "", "fp32")]
    if r.get("optimize"):
        out.append(variant("optimized", "optimize", "optimized/", "fp16" if r["optimize"]["float16"] else "fp32"))
    for q in r.get("quantize", []):
        out.append(variant(q["name"], f"quantize.{q['name']}", f"{q['name']}/", "int4" if q["method"] == "int4" else "int8"))
    return out


def tolerances(recipe: Recipe, v: Variant) -> dict[str, Any]:
    """The base validate section's tolerances for the exported model; the variant's own otherwise."""
    r = recipe.resolved
    if v.name == "model":
        return {}
    own = (r["optimize"] or {}).get("validate", {}) if v.name == "optimized" else next(q["validate"] for q in r["quantize"] if q["name"] == v.name)
    defaults = dict(VARIANT_TOLERANCES[v.precision])
    base = r.get("validate") or {}  # absent for onnx and graph sources: validation needs a torch model
    if base.get("top1_min") is None:
        defaults.pop("top1_min")
    if base.get("cosine_min") is None:
        defaults.pop("cosine_min")
    return {**defaults, **own}


def vocab_size(recipe: Recipe) -> int | None:
    """The config's vocabulary size, when the recipe gives one (int8 calibration inputs need it)."""
    if recipe.source_kind != "huggingface":
        return None
    config = recipe.source.get("config") or {}
    size = config.get("vocab_size")
    return int(size) if size else None
