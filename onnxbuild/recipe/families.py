"""What the recipe layer knows of model families without importing transformers: which have a
fused decoder graph (onnxbuild/fusion/decoder.py), which attend over a sliding window, which
take no positions, and which TorchScript cannot trace.

Kept as data keyed by ``model_type``, so ``show`` and the recipe checks stay free of heavy
imports; a family missing here still builds where its config says what it needs (a recipe's
``sliding_window``, ``export.exporter: dynamo``).
"""

from __future__ import annotations

from collections.abc import Mapping

FUSED_DECODERS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2")


def no_fused_graph(config: object) -> str | None:
    """Why a recipe's config has no fused decoder graph (its model_type is not a fused family),
    or None: the export's and optimize's checks both say it, each with its own fix."""
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind is None or kind in FUSED_DECODERS:
        return None
    return f"no fused graph for model_type {kind!r} (there is one for {', '.join(FUSED_DECODERS)})"


WINDOW_DEFAULTS: dict[str, int] = {
    "mistral": 4096,
    "gemma2": 4096,
    "gemma3": 4096,
    "gemma3_text": 4096,
    "cohere2": 4096,
    "gpt_oss": 128,
}
"""The sliding window transformers' config gives these types when a recipe's config names none
(transformers 5.x): validation then crosses it."""

OPT_IN_WINDOWS = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
"""Types whose ``sliding_window`` applies only with ``use_sliding_window: true``."""

NO_POSITION_IDS = frozenset({"bloom", "mpt"})
"""ALiBi decoders: positions come from the attention mask, and the forward takes no position_ids
(TorchScript drops an unused input, so the file would lack one the recipe lists)."""

DYNAMO_ONLY = frozenset(
    {"cohere", "cohere2", "glm", "glm4", "ernie4_5", "helium", "apertus", "mobilevitv2", "dinov2_with_registers"}
)
"""Types TorchScript cannot export, while the dynamo exporter traces them: an interleaved rotary
(``torch.stack((-x2, x1), -1)`` of strided slices) fails its symbolic ``cat`` ("All tensors must
have the same rank"); Apertus' xIELU activation uses ``expm1``, MobileViTV2 ``col2im`` and
DINOv2 with registers an antialiased bicubic resize (``_upsample_bicubic2d_aa``), which it has no
symbolic for. Their ``export.exporter`` defaults to dynamo."""

RECURRENT = frozenset(
    {
        "mamba",
        "mamba2",
        "falcon_mamba",
        "jamba",
        "bamba",
        "zamba",
        "zamba2",
        "falcon_h1",
        "granitemoehybrid",
        "nemotron_h",
        "qwen3_next",
        "recurrent_gemma",
        "minimax",
        "rwkv",
    }
)
"""Decoders whose cache is a recurrent state (state-space or linear-attention layers), which a
with-past export of keys and values cannot carry: refused at the recipe for text-generation."""


def model_type(config: object) -> str | None:
    found = config.get("model_type") if isinstance(config, Mapping) else None
    return found if isinstance(found, str) else None


def sliding_window(config: object) -> int | None:
    """The attention window a decoder's config gives (explicitly or by its type's default);
    None when every layer attends to the whole past."""
    if not isinstance(config, Mapping):
        return None
    kind = model_type(config)
    if kind in OPT_IN_WINDOWS and config.get("use_sliding_window") is not True:
        return None
    window = config["sliding_window"] if "sliding_window" in config else WINDOW_DEFAULTS.get(kind or "")
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
