"""The ``export`` step's vision-language models (task image-text-to-text): vision.onnx,
embedding.onnx and decoder.onnx traced from sources/vlm.py's wrappers, and the
genai_config.json onnxruntime-genai reads them by."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild._util import brief
from onnxbuild.errors import StepError
from onnxbuild.recipe.resolve import DEFAULT_SAMPLE
from onnxbuild.recipe.sections import ExportSection
from onnxbuild.sources.torchmodel import input_specs, make_inputs
from onnxbuild.steps.base import StepContext, StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def export_files(
    ctx: StepContext,
    model: PreTrainedModel,
    source: dict[str, dict[str, object]],
    record: dict[str, object],
    export: ExportSection,
) -> StepResult:
    """A vision-language model as vision.onnx, embedding.onnx and decoder.onnx (TorchScript, as
    for an encoder-decoder: the decoder's cache is rebuilt from flat tensors), with the
    genai_config.json onnxruntime-genai reads them by."""
    import numpy as np
    import torch

    from onnxbuild.sources import vlm
    from onnxbuild.steps.exporting.files import companion_files, describe, export_file

    layout = vlm.layout_of(model)
    token = vlm.image_token(model)
    text = vlm.text_config(model)
    vocab, hidden = int(text.vocab_size), int(text.hidden_size)
    sample = make_inputs(input_specs(source, export, natural=False), export["sample"], seed=0, vocab=vocab)
    pixels = torch.from_numpy(sample["pixel_values"])
    vision, embedding = vlm.vision_module(model), vlm.embedding_module(model)
    decoder = vlm.decoder_module(model, layout)
    past_len = DEFAULT_SAMPLE["past_sequence"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        try:
            (features,) = vision(pixels)
            per_image = features.shape[0] // pixels.shape[0]
            ids = vlm.text_ids(sample["input_ids"].astype(np.int64), vocab, token)
            counts = vlm.split_images(pixels.shape[0], ids.shape[0])
            prompt = vlm.prompts(ids.tolist(), counts, per_image, token, pad=0)
            t_ids = torch.from_numpy(prompt.input_ids)
            (embeds,) = embedding(t_ids, features)
            batch = t_ids.shape[0]
            # traced with a non-empty cache so its past axis is not constant-folded as zero
            past = tuple(
                torch.randn((batch, layout.kv_heads, past_len, layout.head_dim), generator=generator)
                for _ in layout.past_names
            )
            mask = torch.cat(
                [torch.ones((batch, past_len), dtype=torch.long), torch.from_numpy(prompt.attention_mask)], 1
            )
            positions = torch.from_numpy(prompt.position_ids) + past_len
            decoder(embeds, mask, positions, *past)
        except Exception as exc:
            raise StepError(
                f"the model failed on the export sample ({describe(sample)}): {type(exc).__name__}: "
                f"{brief(exc, limit=400)}"
            ) from None
    _, channels, height, width = pixels.shape
    jobs = [
        (vlm.vision_io(int(channels), int(height), int(width)), vision, (pixels,)),
        (vlm.embedding_io(hidden), embedding, (t_ids, features)),
        (vlm.decoder_io(layout, hidden), decoder, (embeds, mask, positions, *past)),
    ]
    extra: tuple[str, ...] = ()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    for name, (io, module, traced) in zip(vlm.FILES, jobs, strict=True):
        extra += export_file(ctx, name, module, traced, (io.input_names, io.outputs, io.axes), export, params)
    extra += companion_files(ctx, model, source, record, export)
    ctx.output("genai_config.json").write_text(vlm.genai_config(model.config, layout, per_image), encoding="utf-8")
    extra += ("genai_config.json",)
    sizes = ", ".join(f"{name} {ctx.output(name).stat().st_size / 1e6:.1f} MB" for name in vlm.FILES)
    summary = (
        f"torchscript exporter, opset {export['opset']}: {sizes}; {per_image} tokens per image; decoder cache "
        f"{layout.layers} layers x {layout.kv_heads} heads x {layout.head_dim}"
    )
    return StepResult(summary=summary, data={"exporter": "torchscript", "opset": export["opset"]}, extra_outputs=extra)
