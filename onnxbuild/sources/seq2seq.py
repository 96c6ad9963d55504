"""Encoder-decoder models (T5, BART, Marian, Whisper, and a VisionEncoderDecoderModel's image
encoder with its text decoder): two ONNX files and the wrappers that trace them (the loops
that run them are in layouts/seq2seq_decoding.py, their validation in
steps/validating/seq2seq.py).

The layout is onnxruntime-genai's for Whisper (Optimum's file names): ``encoder_model.onnx``
turns the text's tokens (Whisper's log-mel features, an image's pixels) into hidden states once
and projects them, also once, into every decoder layer's cross-attention keys and values
(``present_key_cross_{i}`` / ``present_value_cross_{i}``). ``decoder_model.onnx`` takes new
decoder tokens, the encoder's mask (where the model takes one), its self-attention cache
(``past_key_values.{i}.key`` / ``.value``) and those cross keys and values
(``past_key_cross_{i}`` / ``past_value_cross_{i}``), and returns the logits and the grown
self-attention cache (``present.{i}.key`` / ``.value``). The hidden states themselves are not
a decoder input: each step reads the projected keys and values, so no step recomputes them
over every encoder position (as transformers' generate() does not). A first step is a call
with an empty self cache (past_sequence 0), so one decoder file serves every step.

Axes: the encoder's ``input_ids`` / ``attention_mask`` are [batch, sequence]; the cross keys
and values [batch, heads, sequence, head_dim] (Whisper, an image: a fixed number of positions);
the decoder's ``input_ids`` [batch, decoder_sequence]; its past [batch, heads, past_sequence,
head_dim].

The export runs attention through :func:`fusable_attention`: eager attention's arithmetic
with the query scaled before QK^T, the order ONNX Runtime's bart attention fusion matches.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import Tensor
from onnxbuild.recipe.tasks import DECODER_FILE, ENCODER_FILE
from onnxbuild.sources.decoder import PastLayout
from onnxbuild.sources.vision_encoder_decoder import composite

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache, PreTrainedModel

ENCODER, DECODER = ENCODER_FILE, DECODER_FILE


ENCODER_OUTPUT = "last_hidden_state"


CROSS_PRESENT = "present_{kv}_cross_{i}"
"""The encoder's cross-attention outputs (onnxruntime-genai's Whisper names)."""


CROSS_PAST = "past_{kv}_cross_{i}"
"""The decoder's cross-attention inputs."""


FUSABLE = "onnxbuild_fusable"
"""The attention implementation the export registers with transformers (:func:`fusable_attention`)."""


def cross_outputs(layout: PastLayout) -> list[str]:
    """The encoder file's cross keys and values, layer by layer, key before value."""
    return [CROSS_PRESENT.format(kv=kv, i=i) for i in range(layout.layers) for kv in ("key", "value")]


def cross_inputs(layout: PastLayout) -> list[str]:
    """The decoder file's cross keys and values, in :func:`cross_outputs`' order."""
    return [CROSS_PAST.format(kv=kv, i=i) for i in range(layout.layers) for kv in ("key", "value")]


def layout_of(config: Any) -> PastLayout:
    """The decoder's self-attention cache (and its cross-attention's heads): T5 names its
    sizes num_decoder_layers / num_heads / d_kv, BART, Marian and Whisper decoder_layers /
    decoder_attention_heads / d_model; a VisionEncoderDecoderModel's decoder has its own
    config (GPT-2's n_layer / n_head / n_embd and TrOCR's decoder_layers / ... / d_model, both
    read through transformers' standard names). ``config`` is a transformers config; Any, as
    steps/benchmarking/pytorch.py passes a torch.nn.Module's."""
    if composite(config):
        text = config.decoder
        heads = int(text.num_attention_heads)
        return PastLayout(layers=int(text.num_hidden_layers), kv_heads=heads, head_dim=int(text.hidden_size) // heads)
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


def cross_projections(model: PreTrainedModel) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
    """Each decoder layer's cross-attention key and value projections: BART's family
    (Marian, Whisper, Pegasus..., and TrOCR's decoder) ``layers[i].encoder_attn.k_proj /
    v_proj``, T5's ``block[i].layer[1].EncDecAttention.k / v``, and GPT-2's with
    add_cross_attention ``h[i].crossattention.c_attn`` (keys and values in one Conv1D, split
    here into two Linear layers of the same weights). The export checks them against the
    model's own decoder (:func:`check_decoder`)."""
    decoder = model.get_decoder()  # type: ignore[no-untyped-call]
    if composite(model.config):
        # a causal LM with cross-attention (GPT2LMHeadModel, TrOCRForCausalLM): its layers are
        # inside its base model (transformer.h, model.decoder.layers)
        decoder = decoder.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is not None and all(hasattr(layer, "encoder_attn") for layer in layers):
        return [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in layers]
    blocks = getattr(decoder, "block", None)
    if blocks is not None and all(hasattr(block.layer[1], "EncDecAttention") for block in blocks):
        return [(block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v) for block in blocks]
    h = getattr(decoder, "h", None)
    if h is not None and all(hasattr(block, "crossattention") for block in h):
        return [_split_conv1d(block.crossattention.c_attn.weight, block.crossattention.c_attn.bias) for block in h]
    raise StepError(
        f"{type(model).__name__}: onnxbuild finds no cross-attention key/value projections in its decoder "
        "(it knows BART's layers[i].encoder_attn.k_proj, T5's block[i].layer[1].EncDecAttention.k and GPT-2's "
        "h[i].crossattention.c_attn with add_cross_attention); this encoder-decoder type cannot be exported as "
        "two files yet"
    )


def _split_conv1d(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.nn.Module, torch.nn.Module]:
    """GPT-2's cross-attention ``c_attn`` (a transformers Conv1D: x @ weight + bias, weight
    [in, 2 x out], keys then values) as two Linear layers holding its halves, so the encoder
    file projects keys and values as every other family's do."""
    import torch

    weight, bias = weight.detach(), bias.detach()
    size = weight.shape[1] // 2
    halves = []
    for part in (slice(0, size), slice(size, 2 * size)):
        linear = torch.nn.Linear(weight.shape[0], size, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            linear.weight.copy_(weight[:, part].T)
            linear.bias.copy_(bias[part])
        halves.append(linear)
    return halves[0], halves[1]


def encoder_module(model: Any, names: list[str], layout: PastLayout) -> torch.nn.Module:
    """(the export's inputs: input_ids and attention_mask, Whisper's input_features, or an
    image's pixel_values) -> (hidden states, then each layer's cross key and value [batch,
    heads, sequence, head_dim]). A VisionEncoderDecoderModel whose encoder and decoder widths
    differ first maps the image encoder's states to the decoder's (``enc_to_dec_proj``, as its
    forward does): the cross keys and values are computed from those, while
    ``last_hidden_state`` stays the image encoder's own. ``model`` is a transformers model;
    Any, as steps/benchmarking/pytorch.py holds it as a torch.nn.Module."""
    import torch

    projections = cross_projections(model)
    # present exactly when VisionEncoderDecoderModel.forward applies it (the widths differ and
    # the decoder's config names no cross_attention_hidden_size)
    to_decoder = getattr(model, "enc_to_dec_proj", None) if composite(model.config) else None

    class Encoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()
            self.to_decoder = to_decoder if to_decoder is not None else torch.nn.Identity()
            self.projections = torch.nn.ModuleList([p for pair in projections for p in pair])

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            hidden = self.encoder(**dict(zip(names, args, strict=True)), return_dict=True).last_hidden_state
            states = self.to_decoder(hidden)
            shape = (hidden.shape[0], -1, layout.kv_heads, layout.head_dim)
            cross = [p(states).view(shape).transpose(1, 2) for p in self.projections]
            return (hidden, *cross)

    return Encoder().eval()


def _filled(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache holding these keys and values as they are. Built layer by layer:
    DynamicCache(ddp_cache_data=...) concatenates each onto an empty tensor (the trace then
    constant-folds the past away as an input), and its config= sizes Whisper's cache by the
    encoder's layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    for keys, values in pairs:
        layer = DynamicLayer()  # type: ignore[no-untyped-call]
        layer.keys, layer.values, layer.is_initialized, layer.device = keys, values, True, keys.device
        cache.layers.append(layer)
    return cache


def decoder_module(model: Any, layout: PastLayout, masked: bool) -> torch.nn.Module:
    """(input_ids, [encoder_attention_mask,] self past..., cross keys and values...) ->
    (logits, presents...). Whisper's encoder states have no padding, so its decoder takes no
    mask (``masked`` false)."""
    import torch
    from transformers import EncoderDecoderCache

    # A VisionEncoderDecoderModel's forward would map the stand-in below through
    # enc_to_dec_proj (it expects the image encoder's width): its decoder, a causal LM with
    # cross-attention, is called directly instead, as that forward calls it.
    text = model.decoder if composite(model.config) else None
    cache_arg = _cache_arg(text if text is not None else model)
    count = 2 * layout.layers

    class Decoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
            mask, rest = (rest[0], rest[1:]) if masked else (None, rest)
            past, cross = rest[:count], rest[count:]
            # A filled cross cache marks every layer updated (EncoderDecoderCache.is_updated),
            # so attention reads these keys and values and never projects encoder states.
            cache = EncoderDecoderCache(
                _filled([(past[2 * i], past[2 * i + 1]) for i in range(layout.layers)]),
                _filled([(cross[2 * i], cross[2 * i + 1]) for i in range(layout.layers)]),
            )
            # The model still wants encoder states for their batch size and as a flag that
            # the encoder ran; their values are never read (checked: random values give the
            # same logits), so a view of the first cross key stands in for them.
            stand_in = cross[0].transpose(1, 2).flatten(2)
            if text is not None:
                out = text(
                    input_ids=input_ids,
                    encoder_hidden_states=stand_in,
                    use_cache=True,
                    return_dict=True,
                    **{cache_arg: cache},
                )
            else:
                out = self.model(
                    decoder_input_ids=input_ids,
                    encoder_outputs=(stand_in,),
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


def check_decoder(
    model: PreTrainedModel,
    decoder: torch.nn.Module,
    layout: PastLayout,
    ids: torch.Tensor,
    hidden: torch.Tensor,
    mask: torch.Tensor | None,
    cross: list[torch.Tensor],
) -> None:
    """The export's guard on :func:`cross_projections` and the decoder wrapper: the decoder on
    the encoder wrapper's cross keys and values (and an empty cache) gives the logits the model
    gives on the encoder's hidden states (a type whose cross attention normalizes or rotates
    its keys, or reads the hidden states some other way, would not)."""
    import torch

    empty = [torch.zeros((ids.shape[0], layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
    with torch.no_grad():
        own = model(
            decoder_input_ids=ids,
            encoder_outputs=(hidden,),
            **({"attention_mask": mask} if mask is not None else {}),
            return_dict=True,
        )["logits"]
        got = decoder(ids, *([mask] if mask is not None else []), *empty, *cross)[0]
    if own.shape != got.shape or not torch.allclose(own, got, rtol=1e-4, atol=1e-5):
        raise StepError(
            f"{type(model).__name__}: its decoder gives other logits on the cross-attention keys and values "
            "onnxbuild projects from the encoder than on the encoder's hidden states (max abs diff "
            f"{(own - got).abs().max().item() if own.shape == got.shape else 'n/a (shapes differ)'}); this "
            "encoder-decoder type cannot be exported as two files yet"
        )


def decoder_io(
    layout: PastLayout, encoder_length: int | str, masked: bool
) -> tuple[list[Tensor], list[str], dict[str, dict[int, str]]]:
    """The decoder file's input specs, output names and dynamic axes."""
    cross: list[Tensor] = [
        {"name": n, "dtype": "float32", "shape": ["batch", layout.kv_heads, encoder_length, layout.head_dim]}
        for n in cross_inputs(layout)
    ]
    inputs: list[Tensor] = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "decoder_sequence"]},
        *([Tensor(name="encoder_attention_mask", dtype="int64", shape=["batch", "sequence"])] if masked else []),
        *layout.past_specs(),
        *cross,
    ]
    outputs = ["logits", *layout.present_names]
    axes = {t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in inputs}
    axes["logits"] = {0: "batch", 1: "decoder_sequence"}
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in layout.present_names})
    return inputs, outputs, axes


def _fusable(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention (no dropout: the export runs in eval mode) with the query scaled
    before QK^T and no Mul after it: ONNX Runtime's bart attention fusion matches this
    order, and transformers' eager (scores * scaling) it does not. T5 passes scaling 1.0
    and its relative position bias."""
    import torch

    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if scaling != 1.0:
        query = query * scaling
    scores = torch.matmul(query, key.transpose(2, 3))
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def fusable_attention(model: PreTrainedModel) -> Iterator[None]:
    """The model's eager attention as :func:`_fusable` while the files are traced (the same
    arithmetic, ordered for ONNX Runtime's fusions); an sdpa model is left as it is."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    before = model.config._attn_implementation
    if before != "eager":
        yield
        return
    AttentionInterface.register(FUSABLE, _fusable)
    AttentionMaskInterface.register(FUSABLE, eager_mask)
    model.set_attn_implementation(FUSABLE)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def start_token(config: Any) -> int:
    # a transformers config; Any for the same caller as layout_of
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    return int(start or 0)
