"""What validate checks of a recipe before any step runs (its part of ``StepKind.check``):
shapes that size what the inputs vary, sentences only where a tokenizer reads them, the
text a perplexity gate measures on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from onnxbuild.recipe.checks import THREE_FILES, shape_problems, traced_only
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.resolve import (
    DEFAULT_ATOL,
    DEFAULT_COSINE_MIN,
    DEFAULT_RTOL,
    DEFAULT_TOP1_MIN,
    default_sample,
    default_shapes,
    deref,
    validation_dims,
    with_defaults,
)
from onnxbuild.recipe.sections import TARGETS, ValidateSection
from onnxbuild.recipe.tasks import IMAGE_TASKS
from onnxbuild.recipe.variants import TEXT_GATES, VARIANT_TOLERANCES
from onnxbuild.sources import source_kind
from onnxbuild.sources.usercode import ref_problem
from onnxbuild.spec import Checking, Found, Variant
from onnxbuild.steps.exporting import section as export_kind

OWN = "validate"
"""The key of a variant's own tolerances in its entry (``quantize[0].validate``, ``optimize.validate``):
validate's to read, over the variant's precision's defaults."""


def own(entry: Mapping[str, object]) -> dict[str, object]:
    """A variant entry's own tolerances (``validate:``), {} when it gives none."""
    block = entry.get(OWN)
    return dict(block) if isinstance(block, Mapping) else {}


def section(resolved: Mapping[str, object]) -> ValidateSection | None:
    """A resolved recipe's validate section (None for a source that is not traced)."""
    return cast("ValidateSection | None", resolved.get(OWN))


def shapes(resolved: Mapping[str, object]) -> list[dict[str, int]]:
    """The validation shapes (none for a source that is not traced): what static calibration and
    a benchmark's quality columns are measured at."""
    found = section(resolved)
    return found["shapes"] if found else []


def tolerances(recipe: Recipe, v: Variant) -> dict[str, object]:
    """The base validate section's tolerances for the exported model; the variant's own
    (``v.own``, its entry's ``validate:``) over its precision's defaults otherwise."""
    r = recipe.resolved
    if v.name == "model" and v.precision == "fp32":  # the recipe's own tolerances; a quantized export its precision's
        return {}
    defaults: dict[str, float | None] = dict(VARIANT_TOLERANCES[v.precision])
    base: Mapping[str, object] = section(r) or {}  # absent for onnx and graph sources: validation needs a torch model
    if base.get("top1_min") is None:
        defaults.pop("top1_min")
    if base.get("cosine_min") is None:
        defaults.pop("cosine_min")
    if base.get("text") is None:  # the text gates apply where there is text
        for gate in TEXT_GATES:
            defaults.pop(gate)
    elif v.precision in ("int8", "int4"):
        # where there is text, a quantized variant's top-1 is gated on it, and on random token
        # ids only reported: there a trained model's next-token distribution is near-flat and
        # 4- or 8-bit noise flips many argmaxes (SmolLM2's 8-bit weights: +0.50% perplexity and
        # top-1 0.955 on text, 0.858 on random ids; its GGUF blocks at int8 compute: +0.38%,
        # 0.965 on text, 0.902 on random ids)
        defaults["top1_min"] = None
    return {**defaults, **v.own}


def resolve(doc: dict[str, Any], out: dict[str, Any]) -> None:
    """Three shapes around the export's sample, tolerances, and the gates that apply: top-1
    agreement for a model whose outputs are scores over a vocabulary, cosine with sentences,
    perplexity and KL divergence with text."""
    traced = export_kind.section(out)
    if traced is None:
        return
    ((kind, src),) = out["source"].items()
    described = source_kind(kind)
    sample = {**default_sample(kind, src), **traced["sample"]}
    validate = with_defaults(doc.get("validate", {}), deref("#/$defs/validate"))
    held = set(described.held_dims(src))
    dims = validation_dims(kind, src, list(traced["inputs"]))
    window = described.window(src) if traced["with_past"] else None
    validate.setdefault("shapes", default_shapes(dims, sample, held) + _past_the_window(window, dims))
    validate.setdefault("atol", DEFAULT_ATOL)
    validate.setdefault("rtol", DEFAULT_RTOL)
    validate.setdefault("top1_min", DEFAULT_TOP1_MIN if described.top1(src) else None)
    validate.setdefault("cosine_min", DEFAULT_COSINE_MIN if validate["sentences"] else None)
    properties = deref("#/$defs/validate")["properties"]
    if validate["text"] is not None:
        validate["text"] = with_defaults(validate["text"], properties["text"])
    for gate in TEXT_GATES:  # the exported model's (fp32); a variant's own come from its precision
        validate.setdefault(gate, VARIANT_TOLERANCES["fp32"][gate] if validate["text"] is not None else None)
    if validate["accuracy"] is not None:
        validate["accuracy"] = with_defaults(validate["accuracy"], properties["accuracy"])
    out["validate"] = validate


def _past_the_window(window: int | None, dims: list[str]) -> list[dict[str, int]]:
    """A sliding-window decoder's past longer than its window (three new tokens after a full
    window): a cache or mask that assumes the whole past is attended fails here, where the
    default shapes' short pasts would pass."""
    if not window:
        return []
    return [{**{d: 1 for d in dims}, "batch": 2, "sequence": 3, "past_sequence": window}]


def check(c: Checking) -> Iterable[Found]:
    yield from traced_only(c, "validate")
    validate = c.doc.get("validate") or {}
    accuracy = validate.get("accuracy")
    if isinstance(accuracy, dict) and isinstance(accuracy.get("dataset"), str):
        wrong = ref_problem(accuracy["dataset"])
        if wrong:
            yield ("validate", "accuracy", "dataset"), wrong, False
    if not c.traced:
        return
    if c.task in IMAGE_TASKS and validate.get("sentences") is not None:
        yield (
            ("validate", "sentences"),
            f"task {c.task} takes images (pixel_values), not text; remove validate.sentences",
            True,
        )
    for key in ("sentences", "accuracy") if c.two_files else ():
        if validate.get(key) is not None:
            yield (
                ("validate", key),
                "not available for an encoder-decoder (validation compares encoder states and decoder logits); "
                f"remove validate.{key}",
                True,
            )
    for key in ("sentences", "accuracy") if c.three_files else ():
        if validate.get(key) is not None:
            yield ("validate", key), f"{THREE_FILES}; remove validate.{key}", True
    for i, provider in enumerate(c.doc.get("providers") or [] if c.three_files else []):
        if isinstance(provider, dict) and provider.get("name") in TARGETS:
            yield ("providers", i, "name"), f"{THREE_FILES}; remove the {provider['name']} target", False
    yield from shape_problems(c, "validate", c.dims)
    if validate.get("sentences") is not None and not source_kind(c.source).transformers:
        yield (
            ("validate", "sentences"),
            "needs a huggingface source, whose tokenizer turns the sentences into inputs "
            f"(this recipe's source is {c.source})",
            True,
        )
    if validate.get("cosine_min") is not None and validate.get("sentences") is None:
        yield (
            ("validate", "cosine_min"),
            "compares sentence embeddings; add validate.sentences (the text to embed)",
            True,
        )
    text = validate.get("text")
    if isinstance(text, dict):
        given = [k for k in ("file", "package", "inline") if text.get(k) is not None]
        if not c.decoder:
            yield (
                ("validate", "text"),
                "measures perplexity of a text-generation model (task: text-generation); "
                "for an encoder use validate.sentences",
                True,
            )
        elif len(given) != 1:
            got = f"it has {' and '.join(given)}" if given else "it has none"
            yield (
                ("validate", "text"),
                "give exactly one of file (beside the recipe), package (pkg/file.txt) and inline "
                f"(the text itself); {got}",
                True,
            )
    gates = [g for g in TEXT_GATES if validate.get(g) is not None]
    own = [(path, g) for path, section in _variant_validates(c) for g in TEXT_GATES if g in section]
    if text is None and (gates or own):
        where, gate = (("validate", gates[0]), gates[0]) if gates else ((*own[0][0], own[0][1]), own[0][1])
        yield where, f"{gate} gates quality on real text; add validate.text (the text to measure on)", True


def _variant_validates(c: Checking) -> Iterable[tuple[tuple[str | int, ...], Mapping[str, object]]]:
    """Each variant's own ``validate:`` block (the optimized variant's section, a variant
    entry's), with where it is."""
    for section, value in c.doc.items():
        if isinstance(value, dict) and isinstance(value.get("validate"), dict):
            yield (section, "validate"), value["validate"]
    for section, i, e in c.entries:
        if isinstance(e.get("validate"), dict):
            yield (section, i, "validate"), e["validate"]
