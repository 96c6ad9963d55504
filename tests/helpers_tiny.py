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
