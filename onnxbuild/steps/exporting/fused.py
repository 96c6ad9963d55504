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

from typing import TYPE_CHECKING, cast

from onnxbuild.errors import StepError
from onnxbuild.steps.base import StepContext, StepResult, read_source_record

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray
    from transformers import PreTrainedModel

    from onnxbuild.fusion import decoder
    from onnxbuild.quant.weightcheck import WorstTensor
    from onnxbuild.recipe.sections import ExportSection, ExportWeights, Tensor
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
    checked: list[WorstTensor] = []
    quantize = _quantizer(export["weights"], checked) if export.get("weights") else None
    if external or quantize is not None:
        location = "model.onnx.data"
        with open(ctx.output(location), "wb") as data:
            built = decoder.build(model, shape, data, location, quantize)
        external = True
    else:
        built = decoder.build(model, shape)
    if quantize is not None:
        from onnxbuild.steps.quantizing.nbits import bias_into_nbits

        bias_into_nbits(built.model)
        _gate(checked)
    strip_metadata(built.model)
    fused_ops = _standard_norms(built.model, built.fused_ops)
    onnx.save_model(built.model, str(out))
    extra: tuple[str, ...] = ("model.onnx.data",) if external else ()
    extra += companion_files(ctx, skeleton, source, record, full, layout)
    ops = ", ".join(f"{k} {v}" for k, v in fused_ops.items())
    if quantize is not None:
        nbits = sum(n.op_type == "MatMulNBits" for n in built.model.graph.node)
        checked = list(
            {c["name"]: c for c in sorted(checked, key=lambda c: c["rel_error"])}.values()
        )  # a piece's worst
        w = export["weights"]
        ops += f"; {nbits} MatMuls at {w['bits']} bits (block {w['block_size']}, accuracy_level {w['accuracy_level']})"
        worst = max(checked, key=lambda c: c["rel_error"] / c["rel_max"])
        ops += f", each checked against its float weight: worst relative error {worst['rel_error']:.3f}"
    size = out.stat().st_size + (ctx.output("model.onnx.data").stat().st_size if external else 0)
    return StepResult(
        summary=f"fused {built.family} graph from the weights (no trace), {size / 1e6:.1f} MB; {ops}",
        data={
            "exporter": "fused",
            "opset": export["opset"],
            "fused_ops": fused_ops,
            **(
                {"weights_check": {"checked": len(checked), "worst": max(checked, key=lambda c: c["rel_error"])}}
                if checked
                else {}
            ),
        },
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


def _gate(checked: list[WorstTensor]) -> None:
    """The export fails where a quantized weight is further from its float weight than the
    validation's weights check allows (quant/weightcheck.py): there is no float file to check
    it against later."""
    failed = [c for c in checked if not c["rel_error"] <= c["rel_max"]]
    if failed:
        shown = ", ".join(f"{c['name']} {c['rel_error']:.3f} (at most {c['rel_max']:.3f})" for c in failed[:3])
        raise StepError(
            f"export.weights: {len(failed)} of {len(checked)} quantized weights are further from their float "
            f"weights than {failed[0]['bits']}-bit rounding allows: {shown}; this is a bug in the quantizer, "
            "not in the recipe: report it, or export without export.weights"
        )


def _quantizer(weights: ExportWeights, checked: list[WorstTensor]) -> decoder.Quantize:
    """Each MatMul's weight quantized as the fused writer writes it, by the function a quantize
    entry's weight-only method uses (round-to-nearest; large weights in pieces of columns), and
    the result dequantized against the float weight at once (into ``checked``)."""

    from onnxbuild.quant.streamed import quantized
    from onnxbuild.quant.weightcheck import written
    from onnxbuild.recipe.sections import QuantizeSection
    from onnxbuild.steps.quantizing.nbits import one_matmul

    q: QuantizeSection = {  # type: ignore[typeddict-item]  # the keys the weight-only writer reads
        "name": "model",
        "method": "int4" if weights["bits"] == 4 else "weight_only",
        "bits": weights["bits"],
        "block_size": weights["block_size"],
        "accuracy_level": weights["accuracy_level"],
        "symmetric": weights["symmetric"],
        "algorithm": "rtn",
        "embedding": False,
        "keep": [],
        "exclude_nodes": [],
    }
    each = one_matmul(q)

    def one(node: onnx.NodeProto, w: NDArray[np.generic]) -> onnx.ModelProto:
        # checked piece by piece: a whole 1.6 GB table and its dequantized copies took 11 GB at 3B
        result = each(node, w)
        found = written(result, node.input[1], cast("NDArray[np.float32]", w))
        if found is not None:
            checked.append(found)
        return result

    def quantize(node: onnx.NodeProto, array: NDArray[np.float32]) -> onnx.ModelProto:
        return quantized(node, array, one)

    return quantize
