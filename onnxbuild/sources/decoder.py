"""Causal LMs with a KV cache: the export wrapper, the input names and the cache layout.

One place knows how a transformers decoder takes its past: the wrapper turns the flat
``past_key_values.{i}.key`` / ``.value`` tensors of the ONNX signature into a
transformers ``DynamicCache`` and the returned cache back into ``present.{i}.key`` /
``.value`` (transformers 5.x renamed the ``past_key_values`` argument to ``cache``;
the wrapper passes whichever the model takes). The loops that run such a model, on ONNX
Runtime and on PyTorch, are in layouts/decoding.py: a source builds a model, it does not
run one.

Axes: ``input_ids`` and ``position_ids`` are [batch, sequence]; ``attention_mask`` is
[batch, total_sequence] (past + new tokens); past tensors are [batch, kv_heads,
past_sequence, head_dim] and presents [batch, kv_heads, total_sequence, head_dim]. A
prefill is a call with past_sequence 0.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import ExportSection, Tensor
from onnxbuild.recipe.tasks import PAST as PAST
from onnxbuild.recipe.tasks import PAST_PREFIX as PAST_PREFIX
from onnxbuild.recipe.tasks import PRESENT as PRESENT
from onnxbuild.recipe.tasks import PRESENT_PREFIX as PRESENT_PREFIX
from onnxbuild.runtimes.sessions import Session

if TYPE_CHECKING:
    import torch
    import transformers

GENAI_INPUTS = ("input_ids", "attention_mask", "position_ids")
"""The token inputs onnxruntime-genai feeds a decoder by name (it has no token_type_ids)."""


@dataclass(frozen=True)
class PastLayout:
    """The shape of one model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"

    @property
    def past_names(self) -> list[str]:
        return [PAST.format(i=i, kv=kv) for i in range(self.layers) for kv in ("key", "value")]

    @property
    def present_names(self) -> list[str]:
        return [PRESENT.format(i=i, kv=kv) for i in range(self.layers) for kv in ("key", "value")]

    def past_specs(self) -> list[Tensor]:
        return [
            {"name": n, "dtype": self.dtype, "shape": ["batch", self.kv_heads, "past_sequence", self.head_dim]}
            for n in self.past_names
        ]


def layout_of(config: transformers.PretrainedConfig) -> PastLayout:
    """The KV-cache layout of a transformers config (GPT-2 maps n_layer/n_head onto these names)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return PastLayout(layers=int(config.num_hidden_layers), kv_heads=kv_heads, head_dim=head_dim)


def layout_of_model(model: transformers.PreTrainedModel) -> PastLayout:
    """The KV-cache layout the model itself writes: one token through it with an empty cache.
    Configs name their head counts in many ways (Falcon's multi_query, Bloom's n_head, a
    num_key_value_heads a type ignores); the cache it returns is the one truth."""
    import torch

    ids = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, return_dict=True)
    cache = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        return layout_of(model.config)
    first = layers[0].keys
    shapes = {(tuple(layer.keys.shape[1::2]), tuple(layer.values.shape[1::2])) for layer in layers}
    if len(shapes) != 1:
        raise StepError(
            f"the model's KV cache differs between layers ({sorted(shapes)}): onnxbuild's with-past export "
            "takes one [batch, kv_heads, past_sequence, head_dim] layout for every layer"
        )
    return PastLayout(layers=len(layers), kv_heads=int(first.shape[1]), head_dim=int(first.shape[3]))


def layout_from_session(session: Session) -> PastLayout:
    """The KV-cache layout an ONNX model declares in its inputs."""
    past = [i for i in session.get_inputs() if i.name.startswith(PAST_PREFIX)]
    if not past:
        raise StepError("the model has no past_key_values.* inputs: it was not exported with export.with_past: true")
    shape = past[0].shape
    dtype = "float16" if "float16" in past[0].type else "float32"
    return PastLayout(
        layers=len(past) // 2,
        kv_heads=fixed_dim(shape, 1, "head count"),
        head_dim=fixed_dim(shape, 3, "head size"),
        dtype=dtype,
    )


def fixed_dim(shape: Sequence[int | str | None], axis: int, what: str) -> int:
    """A dimension of the past the model fixes (the KV cache's head count and size always are)."""
    size = shape[axis] if len(shape) > axis else None
    if not isinstance(size, int):
        raise StepError(
            f"the model's past_key_values inputs have no fixed {what} (axis {axis} is {size!r}); "
            "export the model with export.with_past: true (onnxbuild fixes them)"
        )
    return size


def io_names(export: ExportSection, layout: PastLayout) -> tuple[list[Tensor], list[str]]:
    """The full input specs and output names of a with-past export."""
    return [t.copy() for t in export["inputs"]] + layout.past_specs(), list(export["outputs"]) + layout.present_names


def wrap_with_past(
    model: transformers.PreTrainedModel, token_names: list[str], outputs: list[str], layers: int
) -> torch.nn.Module:
    """A module taking (token inputs..., past tensors...) and returning (outputs..., presents...)."""
    import torch
    from transformers import DynamicCache

    params = set(inspect.signature(model.forward).parameters)
    cache_arg = "cache" if "cache" in params else "past_key_values"
    count = len(token_names)

    class WithPast(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            kwargs: dict[str, object] = dict(zip(token_names, args[:count], strict=True))
            past = args[count:]
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            kwargs[cache_arg] = DynamicCache(ddp_cache_data=pairs)
            out = self.model(**kwargs, use_cache=True, return_dict=True)
            cache = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
            flat: list[torch.Tensor] = []
            for layer in cache.layers:
                flat += [layer.keys, layer.values]
            return (*(out[name] for name in outputs), *flat)

    return WithPast().eval()


def genai_pipeline(
    single: str, inputs: list[str], outputs: list[str], *, prefill: str, decode: str
) -> dict[str, object]:
    """A ``genai_config()`` document turned into onnxruntime-genai's ``decoder-pipeline`` type:
    ``prefill`` runs on the prompt (genai's first run), ``decode`` on each generated token.
    Both take and return the same tensors, which genai manages (the ids, the mask, the
    positions, the cache) and hands to whichever file runs. Checked with onnxruntime-genai 0.18
    on SmolLM2-135M (int8 prefill, int4 decode): "The capital of France is Paris."."""
    import json

    doc = json.loads(single)
    decoder = doc["model"]["decoder"]
    del decoder["filename"]
    stages = (("prefill", prefill, True, False), ("decode", decode, False, True))
    decoder["pipeline"] = [
        {
            name: {
                "filename": filename,
                "inputs": list(inputs),
                "outputs": list(outputs),
                "run_on_prompt": on_prompt,
                "run_on_token_gen": on_token,
            }
        }
        for name, filename, on_prompt, on_token in stages
    ]
    doc["model"]["type"] = "decoder-pipeline"
    return dict(doc)


def genai_decoder(
    filename: str, config: transformers.PretrainedConfig, layout: PastLayout, inputs: dict[str, str]
) -> dict[str, object]:
    """genai_config.json's ``model.decoder``: the file, its cache's size and names, and which of
    its inputs genai feeds (``inputs``: genai's name -> the file's); ``config`` is the language
    model's (a vision-language model's text config)."""
    return {
        "filename": filename,
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "head_size": layout.head_dim,
        "hidden_size": int(config.hidden_size),
        "num_attention_heads": int(config.num_attention_heads),
        "num_hidden_layers": layout.layers,
        "num_key_value_heads": layout.kv_heads,
        "inputs": {
            **inputs,
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
    }


def genai_config(config: transformers.PretrainedConfig, layout: PastLayout, input_names: Iterable[str]) -> str:
    """genai_config.json for onnxruntime-genai: where the decoder's inputs and outputs are and
    how big its cache is (greedy search by default; the caller's generator params override).

    The type is genai's generic decoder-only runner (registered as "llama"), whatever the
    architecture: genai's own "gpt2" type expects the combined ``past_%d`` cache of ORT's
    old GPT-2 exports, not the separate key/value tensors written here. Checked with
    onnxruntime-genai 0.18 on tiny GPT-2: the same greedy tokens as ``onnxbuild run``."""
    from onnxbuild._util import pretty_json

    names = set(input_names)
    inputs = {n: n for n in GENAI_INPUTS if n in names}
    eos = getattr(config, "eos_token_id", None)
    bos = getattr(config, "bos_token_id", None)
    context = int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0) or 2048)
    doc = {
        "model": {
            "type": "llama",
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": getattr(config, "pad_token_id", None) or eos,
            "context_length": context,
            "vocab_size": int(config.vocab_size),
            "decoder": genai_decoder("model.onnx", config, layout, inputs),
        },
        "search": {
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    return pretty_json(doc)
