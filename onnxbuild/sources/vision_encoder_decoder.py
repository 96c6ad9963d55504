"""A vision-encoder-decoder (task image-to-text: transformers' VisionEncoderDecoderModel) as the
recipe layer knows it, without importing transformers: the image encoders and text decoders
onnxbuild exports as an encoder-decoder's two files (sources/seq2seq.py), and the recipe's
problems with the config's parts, said before anything is built, and the decoder's token ids
lifted onto a loaded model's config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from onnxbuild.recipe.families import model_type
from onnxbuild.recipe.tasks import IMAGE_TO_TEXT_TYPES
from onnxbuild.sources.kind import Problem

ENCODERS = frozenset({"vit", "deit", "beit", "data2vec-vision", "swin", "swinv2", "donut-swin"})
"""Image encoders exported (each built, validated and generating here with a GPT-2 decoder): each
takes its config's one image size, so the decoder's cross keys and values have a fixed number
of positions."""
DECODERS = {"gpt2": True, "trocr": False, "bart": False, "mbart": False}
"""Text decoders whose cross-attention the encoder file projects (sources/seq2seq.cross_projections:
GPT-2's crossattention.c_attn, TrOCR's, BART's and mBART's (Donut's) encoder_attn), each with
whether its config must say add_cross_attention: true (GPT-2 builds no cross-attention layers
otherwise)."""


def recipe_problems(config: Mapping[str, object], size: tuple[int, int] | None) -> Iterable[Problem]:
    """The config's parts onnxbuild exports: an image encoder of one image size (``size``, from
    config.encoder.image_size), and a text decoder whose cross-attention it projects, GPT-2's with
    its cross-attention layers. A config of another type is _check_model_type's to refuse."""
    if model_type(config) not in IMAGE_TO_TEXT_TYPES:
        return
    key = ("source", "huggingface", "config")
    encoder, decoder = config.get("encoder"), config.get("decoder")
    for part, sub in (("encoder", encoder), ("decoder", decoder)):
        if not isinstance(sub, dict) or model_type(sub) is None:
            yield (
                (*key, part) if isinstance(sub, dict) else key,
                f"a vision-encoder-decoder's config holds its {part}'s own config, with its model_type "
                f"(e.g. {part}: {{model_type: {'vit' if part == 'encoder' else 'gpt2'}, ...}})",
                not isinstance(sub, dict),
            )
    if not isinstance(encoder, dict) or not isinstance(decoder, dict):
        return
    kind = model_type(encoder)
    if kind is not None and kind not in ENCODERS:
        yield (
            (*key, "encoder", "model_type"),
            f"image-to-text exports {', '.join(sorted(ENCODERS))} encoders so far (each takes one image size, whose "
            f"positions the decoder's cross keys and values are laid out for); a {kind} encoder is not supported yet",
            False,
        )
    elif kind is not None and "image_size" in encoder and size is None:
        yield (
            (*key, "encoder", "image_size"),
            "must be a positive integer or a [height, width] pair of them (e.g. 384)",
            False,
        )
    elif kind is not None and size is None:
        yield (
            (*key, "encoder"),
            f"a {kind} encoder takes images of the one size its position embeddings were made for; "
            "give config.encoder.image_size (384 for TrOCR's base models)",
            False,
        )
    text = model_type(decoder)
    if text is not None and text not in DECODERS:
        yield (
            (*key, "decoder", "model_type"),
            f"image-to-text exports {', '.join(sorted(DECODERS))} decoders so far (their cross-attention is "
            f"projected once, in the encoder file); a {text} decoder is not supported yet",
            False,
        )
    elif text is not None and DECODERS[text] and decoder.get("add_cross_attention") is not True:
        yield (
            (*key, "decoder"),
            f"a {text} decoder reads the image through cross-attention layers it builds only with "
            "add_cross_attention: true; add it to config.decoder",
            False,
        )


COMPOSITE = "vision-encoder-decoder"
"""The model type whose config holds its encoder's and decoder's own configs (``config.encoder``,
``config.decoder``): an image model (ViT, DeiT, Swin) and a text decoder (GPT-2, TrOCR) with
cross-attention, joined by transformers' VisionEncoderDecoderModel."""


def composite(config: object) -> bool:
    """A VisionEncoderDecoderModel's config (:data:`COMPOSITE`)."""
    return getattr(config, "model_type", None) == COMPOSITE


class Composite(Protocol):
    """A VisionEncoderDecoderModel's config, as :func:`lift_decoder_ids` reads it."""

    @property
    def decoder(self) -> object: ...


def lift_decoder_ids(config: Composite) -> None:
    """A VisionEncoderDecoderModel's config as transformers' own examples set it up before
    generating: its vocabulary size and its start, end and padding tokens on the outer config,
    taken from the decoder's where the outer one has none (the start token from the decoder's
    decoder_start_token_id, else its bos_token_id, as generate() falls back). Every step reads
    these there (and config.json carries them for ``onnxbuild run``)."""
    text = config.decoder
    start = getattr(text, "decoder_start_token_id", None)
    taken = {
        "vocab_size": getattr(text, "vocab_size", None),
        "decoder_start_token_id": start if start is not None else getattr(text, "bos_token_id", None),
        "eos_token_id": getattr(text, "eos_token_id", None),
        "pad_token_id": getattr(text, "pad_token_id", None),
    }
    for name, value in taken.items():
        if getattr(config, name, None) is None:
            setattr(config, name, value)
