"""The ``export`` step: torch.onnx.export of a torch source, byte-reproducible.

TorchScript is the default exporter: measured here on GPT-2, ONNX Runtime's int8
quantization and transformer fusions work better on its graphs (int8 at seq 128:
~40 ms from a TorchScript export vs ~69 ms from a dynamo export, whose tied lm_head
becomes a runtime Transpose that quantization cannot touch).

Reproducibility: seeded weights, a fixed external-data file name, and for the dynamo
exporter the node metadata it writes (stack traces with absolute paths) removed.

The recipe rules are in steps/exporting/rules.py, the finishing of each written file in
steps/exporting/files.py, a vision-language model's three files in steps/exporting/vlm.py.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from onnxbuild._util import brief
from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.resolve import (
    DEFAULT_SAMPLE,
)
from onnxbuild.recipe.sections import ExportSection
from onnxbuild.recipe.tasks import DEFAULT_DECODER_SEQUENCE
from onnxbuild.recipe.variants import MODEL, SOURCE_RECORD, model_files
from onnxbuild.sources import source_kind
from onnxbuild.sources.decoder import PAST_PREFIX
from onnxbuild.sources.kind import SourceKind
from onnxbuild.sources.torchmodel import (
    full_export,
    input_specs,
    load_source_model,
    make_inputs,
    output_axes,
    vocab_size,
    wrap,
)
from onnxbuild.spec import Branch, Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, read_source_record
from onnxbuild.steps.exporting import rules
from onnxbuild.steps.exporting.files import companion_files, describe, export_file, finalise, pin_output_dims
from onnxbuild.steps.exporting.section import model_precision

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

PACKAGES = ("torch", "transformers", "onnx", "onnxscript")


MEMORY = (3.5, 1200)
"""Peak as (x the fp32 weights, MB more), measured: GPT-2 small 2.8 GB; a Llama-3.2-1B shape
(4.94 GB of weights) 16.6 GB, the torch model, its trace and the ONNX proto held at once."""
FUSED_MEMORY = (0.5, 900)
"""``exporter: fused`` (exporting/fused.py): a Llama-3.2-1B shape 3.4 GB in 31 s, one weight at a
time, the largest (its 1 GB tied table) read and transposed."""


def memory(recipe: Recipe) -> tuple[float, int]:
    return FUSED_MEMORY if recipe.resolved["export"]["exporter"] == "fused" else MEMORY


class ExportParams(TypedDict):
    """What :func:`plan` puts in the step's params."""

    source: dict[str, dict[str, object]]
    export: ExportSection


def plan(p: Planning) -> list[StepSpec]:
    """A traced source's model.onnx (and a transformers model's config.json beside it)."""
    r = p.recipe.resolved
    if not p.recipe.torch_source:
        return []
    return [
        StepSpec(
            name="export",
            kind="export",
            params={"source": r["source"], "export": r["export"]},  # weights: only where given
            deps=("source",),
            inputs=(StepInput("source", SOURCE_RECORD),),
            outputs=(*model_files(p.recipe), "config.json")
            if source_kind(p.recipe.source_kind).transformers
            else (MODEL,),
        )
    ]


def placement(recipe: Recipe) -> tuple[float, int, str]:
    """(CPUs, GPUs, why a GPU) for a cluster: ``export.device: cuda`` needs one."""
    return (1.0, 1, "export.device: cuda") if recipe.resolved["export"]["device"] == "cuda" else (1.0, 0, "")


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    params = cast(ExportParams, spec.params)  # the JSON plan() built
    source, export = params["source"], params["export"]
    ((kind, src),) = source.items()
    described = source_kind(kind)
    if described.convert is not None:
        return _converted(ctx, described, src, export)
    if export["exporter"] == "fused":
        from onnxbuild.steps.exporting import fused

        return fused.export(ctx, source, export)
    import torch

    if export["device"] == "cuda" and not torch.cuda.is_available():
        raise StepError(
            "export.device: cuda was asked for but torch sees no CUDA device here; use device: cpu "
            "(the ONNX file is the same)"
        )
    device = torch.device(export["device"])
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir).to(device)
    ((kind, src),) = source.items()
    if source_kind(kind).seq2seq(src):
        return _seq2seq(ctx, model, source, record, export)
    if source_kind(kind).vlm(src):
        from onnxbuild.steps.exporting.vlm import export_files

        return export_files(ctx, model, source, record, export)
    export = full_export(export, model)
    names = [t["name"] for t in export["inputs"]]
    if described.transformers:
        _traceable_experts(model)
        _takes_every_input(model, names)
    wrapped = wrap(model, source, names, export["outputs"])
    sample = make_inputs(input_specs(source, export, natural=False), export["sample"], seed=0, vocab=vocab_size(model))
    args = tuple(torch.from_numpy(sample[n]).to(device) for n in names)
    with torch.no_grad():
        try:
            produced = wrapped(*args)
        except Exception as exc:
            raise StepError(
                f"the model failed on the export sample ({describe(sample)}): {type(exc).__name__}: "
                f"{str(exc)[:400]}{_known_fix(exc)}"
            ) from None
    if len(produced) != len(export["outputs"]):
        raise StepError(f"export.outputs names {len(export['outputs'])} outputs but the model returns {len(produced)}")
    dynamic_axes: dict[str, dict[int, str]] = {
        t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in export["inputs"]
    }
    dynamic_axes.update(output_axes(source, export))
    out = ctx.output("model.onnx")
    with tempfile.TemporaryDirectory(dir=ctx.output_dir) as tmp:
        raw = Path(tmp) / "model.onnx"
        try:
            if export["exporter"] == "torchscript":
                torch.onnx.export(
                    wrapped,
                    args,
                    str(raw),
                    dynamo=False,
                    input_names=names,
                    output_names=export["outputs"],
                    dynamic_axes=dynamic_axes,
                    opset_version=export["opset"],
                    do_constant_folding=export["constant_folding"],
                )
            else:
                _export_dynamo(wrapped, args, raw, names, export)
        except StepError:
            raise
        except Exception as exc:
            raise StepError(
                f"torch.onnx.export ({export['exporter']}) failed: {type(exc).__name__}: "
                f"{brief(exc, lines=4, limit=600)}"
            ) from None
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        del wrapped
        extra = finalise(raw, out, export, params)
    if described.transformers:
        extra += companion_files(ctx, model, source, record, export)
    summary = f"{export['exporter']} exporter, opset {export['opset']}, {out.stat().st_size / 1e6:.1f} MB"
    return StepResult(
        summary=summary, data={"exporter": export["exporter"], "opset": export["opset"]}, extra_outputs=extra
    )


def _traceable_experts(model: PreTrainedModel) -> None:
    """A mixture of experts computed the way a trace can follow. transformers' default on CPU
    groups tokens by expert with ``torch.histc`` and per-expert slices of data-dependent size
    (no ONNX op, and a trace would fix the sizes); ``batched_mm`` gathers each token's chosen
    experts' weights and multiplies in one batch: Gather and MatMul, exact for every routing.
    The PyTorch reference validation compares against keeps the model's own implementation."""
    can = getattr(type(model), "_can_set_experts_implementation", None)
    if (
        callable(can)
        and can()
        and any(v not in (None, "batched_mm") for v in model.get_experts_implementation().values())
    ):
        model.set_experts_implementation("batched_mm")


KNOWN_FIXES = {
    "no padding token is defined": (
        "a decoder's text-classification head scores each row's last non-padding token, so it needs "
        "config.pad_token_id: set source.huggingface.config.pad_token_id (its tokenizer's pad id, or its eos id)"
    ),
}
"""What to do about a failure transformers reports in its own words (the text it raises -> the fix)."""


def _known_fix(exc: BaseException) -> str:
    """``; <the fix>`` for a failure whose cause is known, else nothing."""
    return next((f"; {fix}" for text, fix in KNOWN_FIXES.items() if text in str(exc)), "")


def _takes_every_input(model: PreTrainedModel, names: list[str]) -> None:
    """Every input the export lists is one the model's forward takes by name: TorchScript drops
    an input the model ignores (a ``**kwargs`` swallows it), and the file would then lack it."""
    import inspect

    params = set(inspect.signature(model.forward).parameters)
    ignored = [n for n in names if n not in params and not n.startswith(PAST_PREFIX)]
    if ignored:
        raise StepError(
            f"export.inputs: {type(model).__name__} takes no {', '.join(ignored)} "
            f"(its forward takes {', '.join(p for p in params if p not in ('self', 'kwargs'))}); "
            "remove them from export.inputs"
        )


def _seq2seq(
    ctx: StepContext,
    model: PreTrainedModel,
    source: dict[str, dict[str, object]],
    record: dict[str, object],
    export: ExportSection,
) -> StepResult:
    """An encoder-decoder model as encoder_model.onnx (hidden states and every layer's cross
    keys and values) and decoder_model.onnx (TorchScript: the decoder's caches are rebuilt
    from flat tensors, which it traces faithfully), attention traced in the order ONNX
    Runtime's fusions match (sources/seq2seq.fusable_attention)."""
    import torch

    from onnxbuild.sources import seq2seq

    layout = seq2seq.layout_of(model.config)
    names = [t["name"] for t in export["inputs"]]
    masked = "attention_mask" in names
    sample = make_inputs(input_specs(source, export, natural=False), export["sample"], seed=0, vocab=vocab_size(model))
    args = tuple(torch.from_numpy(sample[n]) for n in names)
    encoder, decoder = seq2seq.encoder_module(model, names, layout), seq2seq.decoder_module(model, layout, masked)
    batch = args[0].shape[0]
    # export.sample sizes the encoder's inputs; the decoder is traced with a non-empty cache
    # so its past axis is not constant-folded as zero
    steps = int(export["sample"].get("decoder_sequence", DEFAULT_DECODER_SEQUENCE))
    past_len = DEFAULT_SAMPLE["past_sequence"]
    generator = torch.Generator().manual_seed(0)
    decoder_ids = torch.randint(0, int(model.config.vocab_size), (batch, steps), generator=generator)
    past = tuple(
        torch.randn((batch, layout.kv_heads, past_len, layout.head_dim), generator=generator) for _ in layout.past_names
    )
    mask = (torch.from_numpy(sample["attention_mask"]),) if masked else ()
    with torch.no_grad():
        try:
            hidden, *cross = encoder(*args)
            decoder(decoder_ids, *mask, *past, *cross)
        except Exception as exc:
            raise StepError(
                f"the model failed on the export sample ({describe(sample)}): {type(exc).__name__}: "
                f"{brief(exc, limit=400)}{_known_fix(exc)}"
            ) from None
        seq2seq.check_decoder(model, decoder, layout, decoder_ids, hidden, mask[0] if mask else None, cross)
    # the encoder's output length: its input's sequence axis, or fixed (Whisper's 30 s of frames)
    length: int | str = "sequence" if masked else int(hidden.shape[1])
    dec_inputs, dec_outputs, dec_axes = seq2seq.decoder_io(layout, length, masked)
    in_axes = {t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in export["inputs"]}
    out_axes = {0: "batch", **({1: "sequence"} if masked else {})}
    cross_axes = {0: "batch", **({2: "sequence"} if masked else {})}
    enc_outputs = [seq2seq.ENCODER_OUTPUT, *seq2seq.cross_outputs(layout)]
    enc_axes = {**in_axes, seq2seq.ENCODER_OUTPUT: out_axes, **dict.fromkeys(enc_outputs[1:], cross_axes)}
    jobs = [
        (seq2seq.ENCODER, encoder, args, names, enc_outputs, enc_axes),
        (
            seq2seq.DECODER,
            decoder,
            (decoder_ids, *mask, *past, *cross),
            [t["name"] for t in dec_inputs],
            dec_outputs,
            dec_axes,
        ),
    ]
    extra: tuple[str, ...] = ()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    for name, module, traced, inputs, outputs, axes in jobs:
        io = (inputs, outputs, axes)
        extra += export_file(ctx, name, module, traced, io, export, params, seq2seq.fusable_attention(model))
    # an image encoder's outputs have a fixed number of positions (patches and a class token)
    sizes_of = {n: tuple(t.shape) for n, t in zip(enc_outputs, (hidden, *cross), strict=True)}
    pin_output_dims(ctx.output(seq2seq.ENCODER), sizes_of, enc_axes)
    extra += companion_files(ctx, model, source, record, export)
    sizes = ", ".join(f"{name} {ctx.output(name).stat().st_size / 1e6:.1f} MB" for name, *_ in jobs)
    summary = (
        f"torchscript exporter, opset {export['opset']}: {sizes}; decoder cache {layout.layers} layers x "
        f"{layout.kv_heads} heads x {layout.head_dim}, cross keys and values from the encoder"
    )
    return StepResult(summary=summary, data={"exporter": "torchscript", "opset": export["opset"]}, extra_outputs=extra)


def _converted(
    ctx: StepContext, described: SourceKind[Any], src: dict[str, object], export: ExportSection
) -> StepResult:
    """The source's own converter (tf2onnx) instead of torch.onnx: the recipe's inputs are the
    model's input signature."""
    if described.convert is None or described.load_model is None:
        raise StepError(f"a {described.name} source has no converter to ONNX (a bug)")
    record = read_source_record(ctx)
    model = described.load_model(src, record, ctx.recipe_dir)
    out = ctx.output("model.onnx")
    described.convert(model, export, out)
    return StepResult(
        summary=f"{described.converter}, opset {export['opset']}, {out.stat().st_size / 1e6:.1f} MB",
        data={"exporter": described.converter, "opset": export["opset"]},
    )


def _export_dynamo(
    wrapped: torch.nn.Module, args: tuple[torch.Tensor, ...], raw: Path, names: list[str], export: ExportSection
) -> None:
    import torch

    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for t in export["inputs"]:
        axes = {}
        for i, d in enumerate(t["shape"]):
            if isinstance(d, str):
                axes[i] = dims.setdefault(d, torch.export.Dim(d, min=1, max=1 << 20))
        shapes.append(axes)
    program = torch.onnx.export(
        wrapped,
        args,
        dynamo=True,
        input_names=names,
        output_names=export["outputs"],
        # The wrapper takes *args, so torch.export wants the shapes nested one level: ((in0, in1, ...),).
        dynamic_shapes=(tuple(shapes),),
        opset_version=export["opset"],
        optimize=export["constant_folding"],
        external_data=False,
    )
    if program is None:  # only when f= is given, which we don't
        raise StepError("torch.onnx.export (dynamo) returned no program")
    program.save(str(raw), external_data=False)


def _fused(params: Mapping[str, object]) -> bool:
    export = params.get("export")
    return isinstance(export, dict) and export.get("exporter") == "fused"


def _vlm(params: Mapping[str, object]) -> bool:
    source = params.get("source")
    if not isinstance(source, dict) or len(source) != 1:
        return False
    ((kind, src),) = source.items()
    return bool(source_kind(kind).vlm(src))


KIND = StepKind(
    name="export",
    packages=PACKAGES,
    branches=(
        Branch(_fused, "onnxbuild.steps.exporting.fused"),  # with what only it reaches: fusion.decoder, quant.streamed
        Branch(_vlm, "onnxbuild.steps.exporting.vlm"),
    ),
    plan=plan,
    run=run,
    memory=MEMORY,
    memory_for=memory,
    placement=placement,
    imports=("onnxscript",),
    loads_model=True,
    check=rules.check,
    finds=rules.finds,
    resolve=rules.resolve,
    writes_model=lambda recipe: recipe.torch_source,
    model_precision=model_precision,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
