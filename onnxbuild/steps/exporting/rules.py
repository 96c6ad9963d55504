"""What export checks of a recipe and fills in before any step runs (its part of
``StepKind.check``, ``finds`` and ``resolve``): the model's inputs, from the recipe or its
task, with a sample size for every dimension they vary, a KV cache only for a text decoder,
and what an encoder-decoder's two files take."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from onnxbuild.recipe.checks import traced_only
from onnxbuild.recipe.model import is_torch_source
from onnxbuild.recipe.resolve import (
    DEFAULT_SAMPLE,
    default_sample,
    deref,
    symbolic_dims,
    validation_dims,
    with_defaults,
)
from onnxbuild.recipe.tasks import WITH_PAST_INPUTS
from onnxbuild.sources import source_kind
from onnxbuild.spec import Checking, Found


def resolve(doc: dict[str, Any], out: dict[str, Any]) -> None:
    """Inputs and outputs from the task when the recipe gives none, a sample size for every
    dimension they vary (and the past's length with a KV cache)."""
    ((kind, src),) = out["source"].items()
    if not is_torch_source(out["source"]):
        return
    described = source_kind(kind)
    task_inputs, task_outputs = described.default_io(src) if described.default_io else ([], ["output"])
    given = doc.get("export", {})
    export = with_defaults(given, deref("#/$defs/export"))
    if isinstance(given.get("weights"), dict):  # its own defaults, where the recipe gives it
        export["weights"] = with_defaults(given["weights"], deref("#/$defs/export")["properties"]["weights"])
    if "exporter" not in given and (needed := described.exporter(src)):
        export["exporter"] = needed
    default_inputs = past_inputs(kind, src) if export["with_past"] else task_inputs
    export.setdefault("inputs", [dict(t) for t in default_inputs])
    export["inputs"] = [{"dtype": "float32", "shape": [], **t} for t in export["inputs"]]
    export.setdefault("outputs", list(task_outputs))
    defaults = default_sample(kind, src)
    if "sample" not in export:  # not setdefault: its default names only the usual dimensions
        export["sample"] = {d: defaults[d] for d in symbolic_dims(export["inputs"])}
    if export["with_past"]:
        export["sample"] = {
            **export["sample"],
            "past_sequence": export["sample"].get("past_sequence", DEFAULT_SAMPLE["past_sequence"]),
        }
    out["export"] = export


def past_inputs(kind: str, src: Mapping[str, object]) -> list[dict[str, object]]:
    """A with-past decoder's token inputs: ids, the mask over past and new tokens, and the new
    tokens' positions where the model takes them (an ALiBi decoder reads them from the mask)."""
    positions = source_kind(kind).takes_positions(src)
    return [dict(t) for t in WITH_PAST_INPUTS if positions or t["name"] != "position_ids"]


def check(c: Checking) -> Iterable[Found]:
    """Sample sizes for every dimension the inputs vary, inputs named once, a KV cache only for
    a text decoder."""
    yield from traced_only(c, "export")
    export = c.doc.get("export", {})
    if export.get("with_past") and not c.decoder and not c.two_files and not c.three_files:  # their own checks speak
        what = f"task {c.src['task']}" if c.src.get("task") else f"a {c.source} source"
        yield (
            ("export", "with_past"),
            f"applies to huggingface text-generation models (this recipe has {what}); remove it",
            False,
        )
    if export.get("exporter") == "fused":
        yield from _check_fused(c, export)
    elif "weights" in export:
        yield (
            ("export", "weights"),
            "quantized weights are written by exporter: fused only; set export.exporter: fused, "
            "or quantize the export with a quantize entry (method: int4)",
            False,
        )
    if c.two_files:
        yield from _check_two_files(c, export)
    if c.three_files:
        yield from _check_three_files(export)
    if not c.traced:
        return
    described = source_kind(c.source)
    if described.needs_inputs and "inputs" not in export:
        yield (
            ("export",) if "export" in c.doc else ("source", c.source),
            f"a {c.source} source needs export.inputs ({described.needs_inputs})",
            True,
        )
    if described.converter and export.get("exporter", "torchscript") != "torchscript":
        yield (
            ("export", "exporter"),
            f"a {c.source} source is converted with {described.converter}; remove export.exporter",
            False,
        )
    defaults = default_sample(c.source, c.src)
    sample = export.get("sample", {d: defaults[d] for d in c.export_dims if d in defaults})
    missing = [d for d in c.export_dims if d not in sample]
    where = ("export", "sample") if "sample" in export else ("export",) if "export" in c.doc else ("source", c.source)
    images = {"height", "width"} if any(t.get("name") == "pixel_values" for t in c.inputs) else set()
    if images & set(missing) and not described.fixed_image_size(c.src):
        yield (
            where,
            "an image model is exported at one sample size: "
            "give export.sample: {batch: 2, height: 224, width: 224} (or config.image_size)",
            True,
        )
    for d in missing:
        if d not in images:
            yield where, f"give a sample size for dimension {d!r} (e.g. sample: {{{d}: 2}})", True
    names = [t["name"] for t in c.inputs]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield (
                ("export", "inputs", i, "name"),
                f"input {name!r} is listed twice (first as export.inputs[{names.index(name)}])",
                False,
            )


def _check_fused(c: Checking, export: Mapping[str, object]) -> Iterable[Found]:
    """The fused exporter writes a text decoder's graph, with its cache, for the families that have one."""
    from onnxbuild.recipe.families import no_fused_graph

    if not c.decoder or not export.get("with_past"):
        yield (
            ("export", "exporter"),
            "fused writes a text-generation decoder's graph with its KV cache: it needs a huggingface "
            "text-generation source and export.with_past: true; use exporter: torchscript",
            False,
        )
    elif missing := no_fused_graph(c.src.get("config")):
        yield ("export", "exporter"), f"{missing}; use exporter: torchscript", False


def finds(c: Checking) -> Checking:
    """The model's inputs (the recipe's, else its task's), their dimensions and whether it
    takes a KV cache, for every kind's check."""
    export = c.doc.get("export", {})
    with_past = bool(export.get("with_past")) and c.decoder
    inputs: Sequence[Mapping[str, object]] = []
    if c.traced:
        described = source_kind(c.source)
        default_inputs = (
            past_inputs(c.source, c.src)
            if with_past
            else described.default_io(c.src)[0]
            if described.default_io
            else []
        )
        inputs = export.get("inputs") or default_inputs
    return replace(
        c,
        with_past=with_past,
        inputs=tuple(inputs),
        export_dims=tuple(symbolic_dims(inputs)),
        dims=tuple(validation_dims(c.source, c.src, inputs)) if c.traced else (),
        optional=frozenset({"past_sequence"} if with_past else ()),
    )


def _check_three_files(export: Mapping[str, object]) -> Iterable[Found]:
    """A vision-language model's three files take what sources/vlm.py gives them."""
    inputs = export.get("inputs")
    if isinstance(inputs, list):
        names = [str(t.get("name")) for t in inputs if isinstance(t, dict)]
        if names != ["pixel_values", "input_ids"]:
            yield (
                ("export", "inputs"),
                "an image-text-to-text model's inputs are pixel_values [num_images, channels, height, width] "
                f"and input_ids [batch, sequence] (got {', '.join(names) or 'none'}); "
                "remove export.inputs for the defaults",
                False,
            )
    if export.get("with_past"):
        yield (
            ("export", "with_past"),
            "an image-text-to-text model's decoder.onnx always takes its cache (past_key_values.*); remove with_past",
            True,
        )
    if export.get("exporter") == "dynamo":
        yield (
            ("export", "exporter"),
            "an image-text-to-text model exports with torchscript (the decoder's cache is traced from flat tensors); "
            "remove exporter: dynamo",
            False,
        )


def _check_two_files(c: Checking, export: Mapping[str, object]) -> Iterable[Found]:
    """An encoder-decoder's encoder takes its task's inputs, its decoder file always its cache."""
    inputs = export.get("inputs")
    if c.task == "text2text-generation" and isinstance(inputs, list):
        names = sorted(str(t.get("name")) for t in inputs if isinstance(t, dict))
        if names != ["attention_mask", "input_ids"]:
            yield (
                ("export", "inputs"),
                "an encoder-decoder's encoder takes input_ids and attention_mask, both [batch, sequence] "
                f"(got {', '.join(names) or 'none'}); remove export.inputs for the defaults",
                False,
            )
    if export.get("with_past"):
        yield (
            ("export", "with_past"),
            "an encoder-decoder's decoder_model.onnx always takes its cache (past_key_values.*) "
            "and the encoder has none; remove with_past",
            True,
        )
    if export.get("exporter") == "dynamo":
        yield (
            ("export", "exporter"),
            "an encoder-decoder exports with torchscript (the decoder's cache is traced from flat tensors); "
            "remove exporter: dynamo",
            False,
        )
