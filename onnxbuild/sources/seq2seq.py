"""Encoder-decoder models (T5, BART, Marian): two ONNX files and the wrappers that trace them
(the loops that run them are in runtimes/seq2seq_decoding.py, their validation in
steps/validating/seq2seq.py).

The layout is Optimum's and onnxruntime-genai's: ``encoder_model.onnx`` turns the text's
tokens into hidden states once; ``decoder_model.onnx`` takes new decoder tokens, the
encoder's hidden states and mask, and the decoder's self-attention cache, and returns the
logits and the grown cache. A first step is a call with an empty cache (past_sequence 0),
so one decoder file serves the first and every later step. Cross-attention keys and values
are computed from the hidden states in each call: one file instead of two, at the cost of
two small matmuls per layer and step.

Axes: the encoder's ``input_ids`` / ``attention_mask`` are [batch, sequence]; the decoder's
``input_ids`` [batch, decoder_sequence]; its past [batch, heads, past_sequence, head_dim].
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from onnxbuild.recipe.sections import Tensor
from onnxbuild.recipe.tasks import DECODER_FILE, ENCODER_FILE
from onnxbuild.sources.decoder import PastLayout

if TYPE_CHECKING:
    import torch

ENCODER, DECODER = ENCODER_FILE, DECODER_FILE


ENCODER_OUTPUT = "last_hidden_state"


DECODER_INPUTS = ("input_ids", "encoder_hidden_states", "encoder_attention_mask")


def layout_of(config: Any) -> PastLayout:
    """The decoder's self-attention cache: T5 names its sizes num_decoder_layers / num_heads /
    d_kv, BART and Marian decoder_layers / decoder_attention_heads / d_model. ``config`` is a
    transformers config; Any, as steps/benchmarking/pytorch.py passes a torch.nn.Module's."""
    layers = int(
        getattr(config, "num_decoder_layers", None)
        or getattr(config, "decoder_layers", None)
        or config.num_hidden_layers
    )
    heads = int(getattr(config, "decoder_attention_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "d_kv", None) or config.d_model // heads)
    return PastLayout(layers=layers, kv_heads=heads, head_dim=head_dim)


def _cache_arg(model: torch.nn.Module) -> str:
    # transformers 5.x renamed past_key_values to cache on some models
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def encoder_module(model: Any, names: list[str]) -> torch.nn.Module:
    """(the export's inputs: input_ids and attention_mask, or Whisper's input_features) -> (hidden states,).
    ``model`` is a transformers model; Any, as steps/benchmarking/pytorch.py holds it as a torch.nn.Module."""
    import torch

    class Encoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.encoder(**dict(zip(names, args, strict=True)), return_dict=True).last_hidden_state,)

    return Encoder().eval()


def decoder_module(model: Any, layout: PastLayout, masked: bool) -> torch.nn.Module:
    """(input_ids, encoder_hidden_states, [encoder_attention_mask,] past...) -> (logits, presents...).
    Whisper's encoder states have no padding, so its decoder takes no mask (``masked`` false)."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    cache_arg = _cache_arg(model)

    class Decoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor, *rest: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            config = self.model.config
            mask, past = (rest[0], rest[1:]) if masked else (None, rest)
            own = DynamicCache(
                ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layout.layers)], config=config
            )
            cache = EncoderDecoderCache(own, DynamicCache(config=config))
            out = self.model(
                decoder_input_ids=input_ids,
                encoder_outputs=(encoder_hidden_states,),
                use_cache=True,
                **({"attention_mask": mask} if masked else {}),
                return_dict=True,
                **{cache_arg: cache},
            )
            grown = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
            flat: list[torch.Tensor] = []
            for layer in grown.self_attention_cache.layers:
                flat += [layer.keys, layer.values]
            return (out["logits"], *flat)

    return Decoder().eval()


def decoder_io(
    layout: PastLayout, hidden: int, encoder_length: int | str, masked: bool
) -> tuple[list[Tensor], list[str], dict[str, dict[int, str]]]:
    """The decoder file's input specs, output names and dynamic axes."""
    inputs: list[Tensor] = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "decoder_sequence"]},
        {"name": "encoder_hidden_states", "dtype": "float32", "shape": ["batch", encoder_length, hidden]},
        *([Tensor(name="encoder_attention_mask", dtype="int64", shape=["batch", "sequence"])] if masked else []),
        *layout.past_specs(),
    ]
    outputs = ["logits", *layout.present_names]
    axes = {t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in inputs}
    axes["logits"] = {0: "batch", 1: "decoder_sequence"}
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in layout.present_names})
    return inputs, outputs, axes


def start_token(config: Any) -> int:
    # a transformers config; Any for the same caller as layout_of
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    return int(start or 0)
