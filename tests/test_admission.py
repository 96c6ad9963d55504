"""Issue 51: a step whose memory estimate exceeds the machine's memory is refused before it
starts (exit 1, the estimate and the fix), instead of being killed by the kernel part-way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from onnxbuild.cli import cli
from onnxbuild.engine import admission
from onnxbuild.sources.huggingface import config_parameters
from onnxbuild.spec import Limits, Resources, StepSpec

LLAMA_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
LLAMA_1B = {**LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16}
LLAMA_1B |= {"head_dim": 64, "tie_word_embeddings": True}


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        (LLAMA_1B, 1_235_814_400),  # meta-llama/Llama-3.2-1B: 1,235,814,400 with its norms
        (LLAMA_8B, 8_030_261_248),  # meta-llama/Llama-3.1-8B: 8,030,261,248
        ({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12}, 124_439_808),
    ],
)
def test_a_configs_parameters_are_counted_within_a_tenth_of_a_percent(
    config: dict[str, object], parameters: int
) -> None:
    assert config_parameters(config) == pytest.approx(parameters, rel=1e-3)


def spec(memory_mb: int) -> StepSpec:
    return StepSpec(
        name="optimize", kind="optimize", params={}, resources=Resources(memory_mb=memory_mb, memory_basis="4 x 5 GB")
    )


def test_a_step_over_the_machines_memory_is_refused_with_its_estimate_and_the_fix() -> None:
    assert admission.refusal(spec(10_000), Limits(), total_mb=24_000) is None
    message = admission.refusal(spec(30_000), Limits(), total_mb=24_000)
    assert message == (
        "not started: optimize needs about 29.3 GB by its estimate (4 x 5 GB), more than 95% of this machine's "
        "23.4 GB, so it would be killed part-way. Build it on a machine with more memory or from a smaller model "
        "shape; if the estimate is too high for this model, set limits.steps.optimize.memory_mb in the recipe to "
        "what it needs"
    )
    # the recipe's own cap, where the machine has it, is taken over the estimate
    assert admission.refusal(spec(30_000), Limits(memory_mb=20_000), total_mb=24_000) is None
    assert admission.refusal(spec(30_000), Limits(memory_mb=40_000), total_mb=24_000) is not None


def test_an_8b_build_on_this_machine_is_refused_before_its_export_starts(tmp_path: Path) -> None:
    if admission.machine_mb() > 200_000:
        pytest.skip("this machine holds an 8B model's export")
    doc = {
        "name": "llama-8b",
        "source": {
            "huggingface": {
                "model": "meta-llama/Llama-3.1-8B",
                "task": "text-generation",
                "offline": "random-init",
                "config": LLAMA_8B,
            }
        },
        "export": {"with_past": True},
    }
    (tmp_path / "llama-8b.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    dirs = ["--cache-dir", str(tmp_path / "cache"), "--artifacts-dir", str(tmp_path / "artifacts")]
    result = CliRunner().invoke(cli, [*dirs, "make", str(tmp_path / "llama-8b.yaml")])
    assert result.exit_code == 1, result.output
    assert "not started: export needs about " in result.output
    assert "x the model's 32.12 GB of fp32 weights" in result.output
    assert "set limits.steps.export.memory_mb" in result.output and "Traceback" not in result.output
