"""The 2-layer GPT-2 source the tests build from a config (seeded random weights, vocab 1000)."""

from __future__ import annotations

from typing import Any

TINY_GPT2_SOURCE: dict[str, Any] = {
    "huggingface": {
        "model": "openai-community/gpt2",
        "task": "text-generation",
        "offline": "random-init",
        "seed": 0,
        "config": {
            "model_type": "gpt2",
            "vocab_size": 1000,
            "n_positions": 128,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    }
}


TINY_DECODER_SIZES: dict[str, int] = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
"""A 2-layer Llama-family decoder's sizes (GQA 4/2, hidden 64), for configs of any such family."""
