"""``export.exporter: fused``: model.onnx written straight from the weights, without a trace.

For a decoder whose family has a fused graph (fusion/decoder.py), the export is that graph,
written one tensor at a time from the checkpoint's safetensors files (sources/checkpoint.py)
into page-aligned external data: neither the torch model nor a trace nor a whole proto is ever
held, which is what a model of 1B parameters and up needs on a 24 GB machine (a TorchScript
export of a Llama-3.2-1B shape peaked at 16.6 GB). onnxruntime-genai's model builder works
the same way.

What is then validated: the same as for a traced export. validate compares this file with
PyTorch's model (loaded alone, its outputs taken first and the model freed before ONNX Runtime
loads the file) at every shape of ``validate.shapes``; generate compares its greedy tokens
with transformers'. What is given up is the traced graph itself: there is no unfused file to
fall back on or to compare the fused one with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.steps.base import StepContext, StepResult, read_source_record

if TYPE_CHECKING:
    import onnx
    from transformers import PreTrainedModel

    from onnxbuild.recipe.sections import ExportSection, Tensor
    from onnxbuild.sources.checkpoint import Lazy

_ONNX_TYPES = {"int64": 7, "int32": 6, "float32": 1, "float16": 10, "bool": 9}


def signature(inputs: list[Tensor], outputs: list[str], axes: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """A graph with only the export's inputs and outputs, as the fused writer copies them."""
    from onnx import TensorProto, helper

    ins = [
        helper.make_tensor_value_info(t["name"], _ONNX_TYPES.get(t["dtype"], TensorProto.FLOAT), list(t["shape"]))
        for t in inputs
    ]
    outs = []
    for name in outputs:
        named = axes.get(name, {})
        rank = 3 if name == "logits" else 4
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [named.get(i) for i in range(rank)]))
    return helper.make_model(helper.make_graph([], "export", ins, outs))


def export(ctx: StepContext, source: dict[str, dict[str, object]], export: ExportSection) -> StepResult:
    """model.onnx as the fused decoder graph, its config files beside it."""
    import onnx

    from onnxbuild.fusion import decoder
    from onnxbuild.sources.decoder import io_names, layout_of
    from onnxbuild.sources.torchmodel import lazy_source_model, load_source_model, output_axes
    from onnxbuild.steps.exporting.files import PROTOBUF_LIMIT, companion_files, strip_metadata

    record = read_source_record(ctx)
    lazy = lazy_source_model(source, record, ctx.recipe_dir)
    model: Lazy | PreTrainedModel
    if lazy is not None:
        model, weights = lazy
        # the module tree with no weights, for the config files (sources/checkpoint.meta_model)
        skeleton: PreTrainedModel = model._module  # type: ignore[assignment]  # meta_model's
    else:  # weights held only by transformers (in-memory random-init, a GGUF file): loaded whole
        skeleton = model = load_source_model(source, record, ctx.recipe_dir).float().eval()
        weights = 4 * sum(p.numel() for p in skeleton.parameters())
    config = skeleton.config
    if not decoder.supported(str(config.model_type)):
        raise StepError(
            f"export.exporter: fused: no fused graph for model_type {config.model_type!r} "
            f"(supported: {', '.join(decoder.FAMILIES)}); use exporter: torchscript"
        )
    layout = layout_of(config)
    inputs, outputs = io_names(export, layout)
    full: ExportSection = {**export, "inputs": inputs, "outputs": outputs}
    shape = signature(inputs, outputs, output_axes(source, full))
    shape.opset_import[0].version = export["opset"]
    out = ctx.output("model.onnx")
    external = export["external_data"] == "always" or (
        export["external_data"] == "auto" and weights > PROTOBUF_LIMIT * 0.9
    )
    if external:
        location = "model.onnx.data"
        with open(ctx.output(location), "wb") as data:
            built = decoder.build(model, shape, data, location)
    else:
        built = decoder.build(model, shape)
    strip_metadata(built.model)
    fused_ops = _standard_norms(built.model, built.fused_ops)
    onnx.save_model(built.model, str(out))
    extra: tuple[str, ...] = ("model.onnx.data",) if external else ()
    extra += companion_files(ctx, skeleton, source, record, full, layout)
    ops = ", ".join(f"{k} {v}" for k, v in fused_ops.items())
    size = out.stat().st_size + (ctx.output("model.onnx.data").stat().st_size if external else 0)
    return StepResult(
        summary=f"fused {built.family} graph from the weights (no trace), {size / 1e6:.1f} MB; {ops}",
        data={"exporter": "fused", "opset": export["opset"], "fused_ops": fused_ops},
        extra_outputs=extra,
    )


def _standard_norms(model: onnx.ModelProto, fused_ops: dict[str, int]) -> dict[str, int]:
    """ONNX Runtime's SimplifiedLayerNormalization (the first and last norms; the others are
    SkipSimplifiedLayerNormalization, in com.microsoft) written as ONNX 23's RMSNormalization:
    the same computation and attributes, and an export must pass the ONNX checker (the check
    step), which knows no op of ONNX Runtime's in the default domain."""
    count = 0
    for n in model.graph.node:
        if n.op_type == "SimplifiedLayerNormalization" and n.domain in ("", "ai.onnx"):
            n.op_type = "RMSNormalization"
            count += 1
    out = {k: v for k, v in fused_ops.items() if k != "SimplifiedLayerNormalization"}
    return {**out, "RMSNormalization": count} if count else out
