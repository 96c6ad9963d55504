"""A failure transformers reports in its own words gets onnxbuild's fix beside it (steps/export.KNOWN_FIXES):
a decoder's text-classification head with no pad token (found building every
AutoModelForSequenceClassification type: Arcee, CTRL, DiffLlama, Ministral... all failed so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers_cli import run

RECIPE = """name: llama-classifier
source:
  huggingface:
    model: x/llama
    task: text-classification
    offline: random-init
    config: {model_type: llama, vocab_size: 1000, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
             num_attention_heads: 4, num_key_value_heads: 2}
"""


def test_a_decoder_classifier_without_a_pad_token_is_told_to_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("r.yaml").write_text(RECIPE, encoding="utf-8")
    result = run("make", "r.yaml")
    assert result.exit_code == 1
    assert (
        "ValueError: Cannot handle batch sizes > 1 if no padding token is defined.; a decoder's text-classification "
        "head scores each row's last non-padding token, so it needs config.pad_token_id: set "
        "source.huggingface.config.pad_token_id (its tokenizer's pad id, or its eos id)"
    ) in result.output
