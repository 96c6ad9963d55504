"""Finishing an exported file, shared by the export step's paths (one file, an encoder-decoder's
two, a vision-language model's three): its run-specific metadata stripped and written inline
or beside one external-data file of a fixed name, and the companion files Optimum and
onnxruntime-genai read beside it."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild._util import brief
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import ExportSection
from onnxbuild.steps.base import StepContext
from onnxbuild.steps.exporting import expand_shapes

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import torch
    from numpy.typing import NDArray
    from transformers import PreTrainedModel

    from onnxbuild.sources.decoder import PastLayout

PROTOBUF_LIMIT = 2_000_000_000


def companion_files(
    ctx: StepContext,
    model: PreTrainedModel,
    source: dict[str, dict[str, object]],
    record: dict[str, object],
    export: ExportSection,
    layout: PastLayout | None = None,
) -> tuple[str, ...]:
    """config.json, generation_config.json and the tokenizer beside model.onnx, so Optimum's
    ORTModel classes can load the folder; for a with-past decoder, genai_config.json for
    onnxruntime-genai as well (its cache ``layout`` as the model writes it, unless given)."""
    from onnxbuild.sources.torchmodel import load_tokenizer

    written = ["config.json"]  # declared by the pipeline; the rest depend on the model
    model.config.to_json_file(str(ctx.output("config.json")), use_diff=False)
    generation = getattr(model, "generation_config", None)
    if generation is not None and model.can_generate():
        generation.to_json_file(str(ctx.output("generation_config.json")), use_diff=True)
        written.append("generation_config.json")
    try:
        tokenizer = load_tokenizer(source, record, ctx.recipe_dir, key="source.huggingface.tokenizer")
    except StepError:
        tokenizer = None  # random-init or a folder without tokenizer files: nothing to copy
    if tokenizer is not None:
        with tempfile.TemporaryDirectory(dir=ctx.output_dir) as tmp:
            for f in sorted(tokenizer.save_pretrained(tmp)):
                name = Path(f).name
                if Path(f).is_file() and name not in written:
                    Path(f).replace(ctx.output(name))
                    written.append(name)
    if export.get("with_past"):
        from onnxbuild.sources.decoder import genai_config, layout_of_model

        ctx.output("genai_config.json").write_text(
            genai_config(model.config, layout or layout_of_model(model), [t["name"] for t in export["inputs"]]),
            encoding="utf-8",
        )
        written.append("genai_config.json")
    return tuple(written[1:])


def export_file(
    ctx: StepContext,
    name: str,
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    io: tuple[list[str], list[str], dict[str, dict[int, str]]],
    export: ExportSection,
    param_bytes: int,
    around: AbstractContextManager[object] | None = None,
) -> tuple[str, ...]:
    """One of a model's several files (an encoder-decoder's two, a vision-language model's three)
    traced by TorchScript, ``io`` its input names, output names and dynamic axes, inside
    ``around`` (an attention implementation set for the trace), then finished as every exported
    file is; its external-data files' names."""
    import torch

    inputs, outputs, axes = io
    with tempfile.TemporaryDirectory(dir=ctx.output_dir) as tmp:
        raw = Path(tmp) / name
        try:
            with around if around is not None else nullcontext():
                torch.onnx.export(
                    module,
                    args,
                    str(raw),
                    dynamo=False,
                    input_names=inputs,
                    output_names=outputs,
                    dynamic_axes=axes,
                    opset_version=export["opset"],
                    do_constant_folding=export["constant_folding"],
                )
        except Exception as exc:
            raise StepError(
                f"torch.onnx.export of {name} failed: {type(exc).__name__}: {brief(exc, lines=4, limit=600)}"
            ) from None
        return finalise(raw, ctx.output(name), export, param_bytes)


def pin_output_dims(path: Path, traced: Mapping[str, tuple[int, ...]], axes: Mapping[str, Mapping[int, str]]) -> None:
    """Output dimensions the exporter could not infer, which it names after a node
    ("LayerNormalizationlast_hidden_state_dim_1": ViT's class token is concatenated by a traced
    Expand), set to their traced sizes where ``axes`` declares them fixed; the file is rewritten
    only where one is."""
    import onnx

    model = onnx.load_model(str(path), load_external_data=False)
    pinned = False
    for value in model.graph.output:
        sizes = traced.get(value.name)
        if sizes is None:
            continue
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if i < len(sizes) and i not in axes.get(value.name, {}) and dim.HasField("dim_param"):
                dim.dim_value = sizes[i]  # a oneof: clears the exporter's name
                pinned = True
    if pinned:
        onnx.save_model(model, str(path))


def finalise(raw: Path, out: Path, export: ExportSection, param_bytes: int) -> tuple[str, ...]:
    """Strip run-specific metadata, then write inline or with one external-data file of a fixed name."""
    import onnx

    external = export["external_data"] == "always" or (
        export["external_data"] == "auto" and param_bytes > PROTOBUF_LIMIT * 0.9
    )
    if export["external_data"] == "never" and param_bytes > PROTOBUF_LIMIT:
        raise StepError(
            f"export.external_data: never, but the weights take {param_bytes / 1e9:.2f} GB "
            "and protobuf caps a file at 2 GB; use auto"
        )
    model = onnx.load_model(str(raw), load_external_data=True)
    rewritten = expand_shapes.run(model)  # OpenVINO on AVX2 with denormals flushed (expand_shapes.py)
    if (
        export["exporter"] == "torchscript"
        and not rewritten
        and not external
        and not any(raw.parent.glob("*.data"))
        and len(list(raw.parent.iterdir())) == 1
    ):
        raw.replace(out)  # TorchScript output is already deterministic; don't re-serialise it
        return ()
    strip_metadata(model)
    if external:
        return (save_with_data(model, out),)
    onnx.save_model(model, str(out))
    return ()


def save_with_data(model: onnx.ModelProto, out: Path) -> str:
    """Write ``model`` to ``out`` with its weights in one file beside it, ``<out>.data``: a
    fixed name, so the bytes are reproducible. Returns that file's name."""
    import onnx

    location = f"{out.name}.data"
    onnx.save_model(
        model,
        str(out),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=1024,
    )
    return location


def strip_metadata(model: onnx.ModelProto) -> None:
    """Node metadata from the dynamo exporter holds stack traces with absolute paths."""

    def clean(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            del node.metadata_props[:]
            for attr in node.attribute:
                if attr.HasField("g"):  # touching attr.g on a non-graph attribute would create it
                    clean(attr.g)
                for g in attr.graphs:
                    clean(g)
        del graph.metadata_props[:]

    clean(model.graph)
    for fn in model.functions:
        for node in fn.node:
            del node.metadata_props[:]
    kept = [p for p in model.metadata_props if "path" not in p.key.lower() and "trace" not in p.key.lower()]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)


def describe(inputs: dict[str, NDArray[np.generic]]) -> str:
    return ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in inputs.items())
