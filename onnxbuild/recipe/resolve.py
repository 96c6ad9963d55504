"""A recipe with every default filled in: what the build depends on, and what its keys hash.

Defaults come from the schema (``default`` on each property) and, where they depend on
other keys (validation shapes from the export's sample sizes, a language model's top-1
floor), from the kind that owns the section (``StepKind.resolve``, passed in: this layer
names no step kind). Every section the schema accepts must come out of ``resolve``:
tests/test_kinds.py fails for one that is dropped (it would never reach a key).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from onnxbuild.recipe.tasks import DERIVED_DIMS, SIZE_DIMS
from onnxbuild.sources import source_kind

if TYPE_CHECKING:
    from onnxbuild.recipe.sections import Resolved
    from onnxbuild.spec import StepKind

DEFAULT_SAMPLE = {"batch": 2, "sequence": 16, "past_sequence": 4, "samples": 1600, "choices": 3}
"""Export sample sizes; ``samples`` is 0.1 s of 16 kHz audio (a wav2vec2 feature encoder's
receptive field is 400), ``choices`` a multiple-choice question's answers."""

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
DEFAULT_TOP1_MIN = 0.99
DEFAULT_COSINE_MIN = 0.99
"""validate.cosine_min when validate.sentences is given: float32 exports of sentence encoders measure above 0.9999."""


@cache
def schema_text() -> str:
    return (Path(__file__).parent / "schema.json").read_text(encoding="utf-8")


@cache
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(schema_text())
    return data


def deref(ref: str) -> dict[str, Any]:
    node = schema()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def validation_dims(kind: str, src: Mapping[str, object], inputs: Iterable[Mapping[str, object]]) -> list[str]:
    """The dimensions validation varies: the export's symbolic ones, plus those the source
    kind always varies (a transformers model's batch and sequence) whatever the export
    declared, so an axis fixed by mistake in export.inputs is caught instead of validated
    at its one fixed size."""
    dims = symbolic_dims(inputs)
    always = tuple(source_kind(kind).varied_dims(src))
    return [*always, *(d for d in dims if d not in always)]


def default_sample(kind: str, src: Mapping[str, object]) -> dict[str, int]:
    """Export sample sizes when the recipe gives none: the usual ones, and what the source
    kind knows from its config (an image model's image_size)."""
    return {**DEFAULT_SAMPLE, **source_kind(kind).sample_defaults(src)}


def symbolic_dims(inputs: Iterable[Mapping[str, object]]) -> list[str]:
    dims: list[str] = []
    for t in inputs:
        shape = t.get("shape", [])
        for d in shape if isinstance(shape, list) else ():  # a list wherever the schema checked it
            if isinstance(d, str) and d not in dims and d not in DERIVED_DIMS:
                dims.append(d)
    return dims


# ---------------------------------------------------------------- defaults


def resolve(doc: dict[str, Any], kinds: Sequence[StepKind]) -> Resolved:
    """Fill every default so the result says everything the build depends on: the source's,
    each section's from the schema, then what each kind derives from other keys (``StepKind.resolve``,
    in the registry's order: validation shapes from the export's sample sizes)."""
    kind = next(iter(doc["source"]))
    out: dict[str, Any] = {
        "name": doc["name"],
        "description": doc.get("description", ""),
        "source": {kind: with_defaults(doc["source"][kind], deref(f"#/$defs/{kind}_source"))},
    }
    source_kind(kind).resolve(out["source"][kind], lambda section, ref: with_defaults(section, deref(ref)))
    # Every section from the schema alone: its defaults, and each object inside it (a variant
    # list's entries, their calibration and budget) with its own. An absent section takes the
    # section's own default where the schema gives one (none for the optimized variant, no
    # quantize entries, no limits), and stays absent where it gives none: a new step kind
    # needs its schema block and nothing here.
    for key, prop in schema()["properties"].items():
        if key in out:
            continue
        if key in doc:
            out[key] = _fill(doc[key], prop)
        elif "default" in prop:
            out[key] = _fill(json.loads(json.dumps(prop["default"])), prop)
    for step_kind in kinds:
        step_kind.resolve(doc, out)
    # A schema-checked recipe filled from the schema and the kinds: the shape Resolved names
    # (tests/test_kinds.py holds the TypedDicts and the schema to the same keys).
    return cast("Resolved", {key: out[key] for key in schema()["properties"] if key in out})  # as `show` prints it


def default_shapes(
    dims: list[str], sample: dict[str, int], held: frozenset[str] | set[str] = frozenset()
) -> list[dict[str, int]]:
    """Three shapes: all ones, the export sample, and one larger than the sample in every dimension.

    Two of them differ from the sample, so an axis the export fixed by mistake fails validation.
    An image is never one pixel (a convolution's kernel is larger): the first shape keeps the
    sample's image size. ``held`` dimensions (the source kind's ``held_dims``) stay at the
    sample size in all three.
    """
    if not dims:
        return [{}]
    smallest = {d: sample[d] if d in SIZE_DIMS or d in held else 1 for d in dims}
    return [smallest, {d: sample[d] for d in dims}, {d: sample[d] if d in held else sample[d] * 2 + 1 for d in dims}]


def _object_schema(sch: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a value is filled from: through ``$ref``, or an ``anyOf``'s object branch."""
    if "$ref" in sch:
        return _object_schema(deref(sch["$ref"]))
    for branch in sch.get("anyOf", []):
        found = _object_schema(branch)
        if found is not None:
            return found
    return sch if "properties" in sch else None


def _fill(value: object, sch: dict[str, Any]) -> object:
    """``value`` with its schema's defaults: an object's missing keys take their ``default``, and
    each object inside it, or each entry of a list of objects, takes its own."""
    if isinstance(value, list):
        items = sch.get("items") or (deref(sch["$ref"]).get("items") if "$ref" in sch else None)
        return [_fill(v, items) for v in value] if isinstance(items, dict) else value
    obj = _object_schema(sch)
    if obj is None or not isinstance(value, dict):
        return value
    out = with_defaults(value, obj)
    for key, prop in obj.get("properties", {}).items():
        if key in out and out[key] is not None:
            out[key] = _fill(out[key], prop)
    return out


def with_defaults(section: dict[str, Any], sch: dict[str, Any]) -> dict[str, Any]:
    out = dict(section)
    for key, prop in sch.get("properties", {}).items():
        if key not in out and "default" in prop:
            default = prop["default"]
            out[key] = json.loads(json.dumps(default))
    return out
