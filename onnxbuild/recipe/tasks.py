"""What each Hugging Face task exports: inputs, outputs and the Auto class that builds it.

Kept as data (not code that imports transformers) so ``show`` can print the resolved
inputs without importing anything heavy.
"""

from __future__ import annotations

from typing import Any, TypedDict


class TaskInfo(TypedDict):
    """A Hugging Face task: its model class, default inputs and outputs, whether it is a language model."""

    auto_class: str
    inputs: list[dict[str, Any]]
    outputs: list[str]
    language_model: bool


_TOKENS = ["batch", "sequence"]

TASKS: dict[str, TaskInfo] = {
    "feature-extraction": {
        "auto_class": "AutoModel",
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": _TOKENS},
            {"name": "attention_mask", "dtype": "int64", "shape": _TOKENS},
        ],
        "outputs": ["last_hidden_state"],
        "language_model": False,
    },
    "text-classification": {
        "auto_class": "AutoModelForSequenceClassification",
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": _TOKENS},
            {"name": "attention_mask", "dtype": "int64", "shape": _TOKENS},
        ],
        "outputs": ["logits"],
        "language_model": False,
    },
    "fill-mask": {
        "auto_class": "AutoModelForMaskedLM",
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": _TOKENS},
            {"name": "attention_mask", "dtype": "int64", "shape": _TOKENS},
        ],
        "outputs": ["logits"],
        "language_model": True,
    },
    # GPT-2's attention mask is all ones for a single unpadded prompt; the seeds leave it out,
    # and so do we by default (the export wrapper supplies it so TorchScript can trace).
    "text-generation": {
        "auto_class": "AutoModelForCausalLM",
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": _TOKENS}],
        "outputs": ["logits"],
        "language_model": True,
    },
}

TOKEN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids"})

# export.with_past: a decoder takes its mask over past + new tokens, and explicit positions
# (they continue after the past); the past_key_values.* inputs are added from the config.
WITH_PAST_INPUTS: list[dict[str, Any]] = [
    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
    {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total_sequence"]},
    {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
]
DERIVED_DIMS = frozenset({"total_sequence"})
"""Dimensions computed from others (past_sequence + sequence), never sized in a recipe."""
