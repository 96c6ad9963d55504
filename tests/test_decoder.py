"""Decoders with a KV cache: export with past, validation at prefill and decode, generation
against transformers' generate(), decode benchmarks, and ``onnxbuild run`` (tiny GPT-2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import onnxbuild
from onnxbuild.api import load_recipe
from onnxbuild.cli import cli
from onnxbuild.environment import BF16_FLAGS, missing_feature
from onnxbuild.errors import RecipeError
from onnxbuild.layouts.decoding import Generation
from onnxbuild.report import benchmark_schema
from onnxbuild.steps.generate import compare_runs

DATA = Path(__file__).resolve().parent / "data"
RECIPE = "recipes/tiny-past.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decoder")
    (root / "recipes").mkdir()
    shutil.copy(DATA / "tiny-past.yaml", root / RECIPE)
    settings = onnxbuild.Settings(cache_dir=root / ".onnxbuild" / "cache", artifacts_dir=root / "artifacts")
    report = onnxbuild.build([root / RECIPE], settings, jobs=2)
    assert report.ok, report.failures()
    return root / "artifacts" / "tiny-past"


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_export_takes_and_returns_the_kv_cache_with_symbolic_axes(built: Path) -> None:
    session = ort.InferenceSession(str(built / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["attention_mask"] == ["batch", "total_sequence"]
    assert inputs["past_key_values.1.value"] == ["batch", 4, "past_sequence", 16]
    assert sorted(n for n in inputs if n.startswith("past")) == sorted(
        f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
    )
    assert outputs["logits"] == ["batch", "sequence", 1000]
    assert outputs["present.0.key"] == ["batch", 4, "total_sequence", 16]
    # A prefill is a call with an empty past.
    empty = np.zeros((1, 4, 0, 16), dtype=np.float32)
    feeds = {
        "input_ids": np.array([[5, 6, 7]]),
        "attention_mask": np.ones((1, 3), dtype=np.int64),
        "position_ids": np.array([[0, 1, 2]]),
    }
    feeds.update({n: empty for n in inputs if n.startswith("past")})
    logits, present = session.run(["logits", "present.0.key"], feeds)
    assert logits.shape == (1, 3, 1000) and present.shape == (1, 4, 3, 16)


def test_every_variant_is_validated_at_prefill_and_at_decode_steps(built: Path) -> None:
    validation = read(built / "reports" / "validation.json")
    assert validation["passed"] is True
    for name, v in validation["variants"].items():
        cases = [s["shape"] for s in v["shapes"]]
        # Each shape without a past runs as a prefill and as one decode step after it; an explicit past runs as given.
        assert cases == [
            {"batch": 1, "sequence": 1, "past_sequence": 0},
            {"batch": 1, "sequence": 1, "past_sequence": 1},
            {"batch": 2, "sequence": 16, "past_sequence": 0},
            {"batch": 2, "sequence": 1, "past_sequence": 16},
            {"batch": 1, "sequence": 1, "past_sequence": 40},
            # and a left-padded batch at the first shape of two rows, compared at its real tokens
            {"batch": 2, "sequence": 16, "past_sequence": 0, "left_padding": 8},
            {"batch": 2, "sequence": 1, "past_sequence": 16, "left_padding": 8},
        ], name
        for case in v["shapes"]:
            assert set(case["outputs"]) == {
                "logits",
                "present.0.key",
                "present.0.value",
                "present.1.key",
                "present.1.value",
            }
    model = validation["variants"]["model"]["shapes"][3]
    assert model["outputs"]["present.1.value"]["shape_onnx"] == [2, 4, 17, 16]
    assert (
        max(c["max_abs_diff"] for s in validation["variants"]["model"]["shapes"] for c in s["outputs"].values()) < 1e-5
    )


def test_greedy_generation_matches_transformers_generate_token_for_token(built: Path) -> None:
    gen = read(built / "reports" / "generation.json")
    assert gen["passed"] is True
    assert gen["prompt_ids"] == [11, 22, 33, 44, 55, 66, 77, 88]
    assert len(gen["pytorch"]["greedy_tokens"]) == 32
    for name in ("model", "optimized"):
        v = gen["variants"][name]
        assert v["greedy"]["identical"] is True and v["greedy"]["tokens"] == gen["pytorch"]["greedy_tokens"]
        assert len(v["greedy"]["logits_max_abs_diff_per_step"]) == 32
        assert v["greedy"]["logits_max_abs_diff"] < 1e-4
        assert v["teacher_forced_agreement"] == 1.0
        # Sampling draws the same numbers on both sides: fp32 variants pick the same tokens.
        assert v["sampling"]["tokens"] == gen["pytorch"]["sampling_tokens"]
    # Sampling varies the tokens, so the comparison is not one repeated token.
    assert len(set(gen["pytorch"]["sampling_tokens"])) > 10
    int8 = gen["variants"]["int8"]
    assert int8["rule"].startswith("reported only") and 0.0 <= int8["teacher_forced_agreement"] <= 1.0
    assert int8["greedy"]["logits_max_abs_diff"] > 1e-4  # quantization changes the numbers
    assert "| model | yes |" in (built / "reports" / "generation.md").read_text(encoding="utf-8")


def test_benchmark_reports_prefill_and_per_token_decode_beside_pytorch_generate(built: Path) -> None:
    report = read(built / "benchmark.json")
    jsonschema.validate(report, benchmark_schema())
    decode = report["decode"]
    engines = [(d["engine"], d["variant"]) for d in decode]
    bf16 = (
        [("pytorch", None)] if missing_feature(BF16_FLAGS, "bf16") is None else []
    )  # PyTorch with bf16 weights beside fp32
    assert engines == [
        ("pytorch", None),
        *bf16,
        ("onnxruntime", "model"),
        ("onnxruntime", "optimized"),
        ("onnxruntime", "int8"),
        ("onnxruntime", "int8-served"),
    ]
    for d in decode:
        assert d["new_tokens"] == 8 and d["shape"] == {"batch": 1, "sequence": 16}
        assert d["decode_p50_ms"] > 0 and d["prefill_p50_ms"] > 0 and d["tokens_per_s"] > 0
        assert d["decode_ratio_to_pytorch"] == pytest.approx(
            d["decode_p50_ms"] / decode[0]["decode_p50_ms"], rel=0.01, abs=1e-3
        )
    assert "## Generation (KV cache)" in (built / "benchmark.md").read_text(encoding="utf-8")


def test_the_folder_has_what_optimum_and_onnxruntime_genai_read(built: Path) -> None:
    config = read(built / "config.json")
    assert config["model_type"] == "gpt2" and config["n_layer"] == 2
    assert read(built / "generation_config.json")["eos_token_id"] == 0
    genai = read(built / "genai_config.json")["model"]
    assert genai["type"] == "llama" and genai["vocab_size"] == 1000 and genai["context_length"] == 128
    decoder = genai["decoder"]
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]) == (2, 4, 16)
    names = {
        i.name for i in ort.InferenceSession(str(built / "model.onnx"), providers=["CPUExecutionProvider"]).get_inputs()
    }
    assert {
        decoder["inputs"]["input_ids"],
        decoder["inputs"]["attention_mask"],
        decoder["inputs"]["position_ids"],
    } <= names
    assert decoder["inputs"]["past_key_names"] % 1 in names


def test_a_served_variant_runs_the_prompt_on_one_file_and_each_token_after_it_on_the_other(built: Path) -> None:
    served = built / "int8-served"
    # the two files are the paired variants' own bytes (one cache object each, hard-linked)
    assert (served / "prefill.onnx").read_bytes() == (built / "optimized" / "model.onnx").read_bytes()
    assert (served / "model.onnx").read_bytes() == (built / "int8" / "model.onnx").read_bytes()
    prefill = ort.InferenceSession(str(served / "prefill.onnx"), providers=["CPUExecutionProvider"])
    decode = ort.InferenceSession(str(served / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in decode.get_inputs()]
    genai = read(served / "genai_config.json")["model"]
    assert genai["type"] == "decoder-pipeline" and "filename" not in genai["decoder"]
    stages = [next(iter(stage.items())) for stage in genai["decoder"]["pipeline"]]
    assert [(n, s["filename"], s["run_on_prompt"], s["run_on_token_gen"]) for n, s in stages] == [
        ("prefill", "prefill.onnx", True, False),
        ("decode", "model.onnx", False, True),
    ]
    assert all(s["inputs"] == names and s["outputs"] == [o.name for o in decode.get_outputs()] for _, s in stages)

    # by hand: the prompt through the float file, then greedy steps through the int8 file
    prompt = read(built / "reports" / "generation.json")["prompt_ids"]
    feeds = {
        "input_ids": np.array([prompt]),
        "attention_mask": np.ones((1, len(prompt)), dtype=np.int64),
        "position_ids": np.arange(len(prompt))[None],
    }
    feeds |= {n: np.zeros((1, 4, 0, 16), dtype=np.float32) for n in names if n.startswith("past")}
    outputs = [o.name for o in decode.get_outputs()]
    first = dict(zip(outputs, prefill.run(None, feeds), strict=True))
    assert not np.allclose(first["logits"], decode.run(["logits"], feeds)[0], atol=1e-4)  # the files differ
    tokens, out = [], first
    for t in range(len(prompt), len(prompt) + 12):
        tokens.append(int(out["logits"][0, -1].argmax()))
        step = {"input_ids": np.array([[tokens[-1]]]), "attention_mask": np.ones((1, t + 1), dtype=np.int64)}
        step |= {"position_ids": np.array([[t]])}
        step |= {n: out[n.replace("past_key_values", "present")] for n in names if n.startswith("past")}
        out = dict(zip(outputs, decode.run(None, step), strict=True))
    result = CliRunner().invoke(
        cli, ["run", str(built), "--variant", "int8-served", "-p", " ".join(map(str, prompt)), "-n", "12", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["new_ids"] == tokens and payload["prefill"] == str(served / "prefill.onnx")

    # validated, generated and timed as served: its own report, rows with both files' bytes
    validation = read(built / "reports" / "validation.json")["variants"]["int8-served"]
    assert validation["passed"] is True
    row = next(r for r in read(built / "benchmark.json")["results"] if r["variant"] == "int8-served")
    assert row["file_bytes"] == (served / "model.onnx").stat().st_size + (served / "prefill.onnx").stat().st_size
    assert read(built / "reports" / "generation.json")["variants"]["int8-served"]["greedy"]["identical"] is True


def test_run_generates_the_same_tokens_as_the_build(built: Path) -> None:
    gen = read(built / "reports" / "generation.json")
    result = CliRunner().invoke(
        cli, ["run", str(built), "--prompt", " ".join(map(str, gen["prompt_ids"])), "--max-new-tokens", "32", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    # eos is token 0 here; the random-init model never produces it in these 32 steps.
    assert payload["new_ids"] == gen["pytorch"]["greedy_tokens"]
    assert payload["text"] is None and payload["tokens_per_s"] > 0
    sampled = CliRunner().invoke(
        cli,
        [
            "run",
            str(built),
            "--variant",
            "optimized",
            "-p",
            " ".join(map(str, gen["prompt_ids"])),
            "-n",
            "32",
            "--sample",
            "--json",
        ],
    )
    assert json.loads(sampled.stdout)["new_ids"] == gen["pytorch"]["sampling_tokens"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "hello there"], "has no tokenizer files, so --prompt must be token ids"),
        (
            ["--prompt", "1 2", "--variant", "int9"],
            "int9/model.onnx does not exist (variants here: model, int8, int8-served, optimized)",
        ),
        (["--prompt", "5000"], "token id 5000 is outside the vocabulary (size 1000)"),
        (["--prompt", "1 2", "-n", "200"], "exceeds the model's context of 128; ask for at most 126"),
    ],
)
def test_run_refuses_bad_requests_with_exit_2(built: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["run", str(built), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_run_refuses_a_model_without_past(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(
        helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]),
        str(tmp_path / "model.onnx"),
    )
    result = CliRunner().invoke(cli, ["run", str(tmp_path), "--prompt", "1"])
    assert result.exit_code == 2
    assert "takes no past_key_values inputs: build it with export.with_past: true" in result.output


def test_compare_runs_finds_the_first_divergence_and_compares_logits_up_to_it() -> None:
    logits = [np.full((1, 4), float(i)) for i in range(4)]
    ref = Generation(np.array([[1, 2, 3, 4]]), logits)
    got = Generation(np.array([[1, 2, 9, 4]]), [logits[0], logits[1] + 0.5, logits[2] + 0.25, logits[3] + 100.0])
    cmp = compare_runs(ref, got)
    assert cmp["identical"] is False and cmp["first_divergence"] == 2 and cmp["agreement"] == 0.75
    # Step 3's logits follow a different text: not compared.
    assert cmp["logits_max_abs_diff_per_step"] == [0.0, 0.5, 0.25] and cmp["logits_max_abs_diff"] == 0.5


BASE = """
name: lm
source:
  huggingface: {model: gpt2, task: %s, offline: random-init, config: {model_type: gpt2}}
export:
  with_past: %s
"""


@pytest.mark.parametrize(
    ("task", "with_past", "extra", "message"),
    [
        (
            "feature-extraction",
            "true",
            "",
            "export.with_past: applies to huggingface text-generation models (this recipe has task "
            "feature-extraction); remove it",
        ),
        (
            "text-generation",
            "false",
            "generate: {max_new_tokens: 4}\n",
            "generate: generates through the KV cache; add export.with_past: true",
        ),
        (
            "text-generation",
            "true",
            "generate: {max_new_tokens: 4, prompt: hi, prompt_ids: [1]}\n",
            "generate.prompt_ids: give either prompt (text) or prompt_ids (token ids), not both",
        ),
        ("text-generation", "true", "generate: {prompt: hi}\n", "generate: missing required key 'max_new_tokens'"),
        ("text-generation", "true", "generate: {max_new_tokens: 0}\n", "generate.max_new_tokens:"),
        (
            "text-generation",
            "true",
            "quantize: [{name: int8, method: dynamic}]\nserve: [{name: s, decode: int4, prefill: int8}]\n",
            "serve[0].decode: no variant 'int4' to pair here (variants made before serve: model, int8)",
        ),
        (
            "text-generation",
            "true",
            "quantize: [{name: int8, method: dynamic}]\nserve: [{name: s, decode: int8, prefill: int8}]\n",
            "serve[0].prefill: names 'int8' as decode too; pair two variants",
        ),
        (
            "text-generation",
            "true",
            "serve: [{name: s, decode: model, prefill: s}]\n",
            "serve[0].prefill: no variant 's' to pair here (variants made before serve: model)",
        ),
        (
            "text-generation",
            "false",
            "quantize: [{name: int8, method: dynamic}]\nserve: [{name: s, decode: int8, prefill: model}]\n",
            "serve: a decoder is served by two files (one for the prompt, one per token after it) only when it "
            "takes its KV cache: set export.with_past: true",
        ),
        (
            "text-generation",
            "true",
            "serve: [{name: s, decode: model}]\n",
            "serve[0]: missing required key 'prefill'",
        ),
        (
            "text-generation",
            "true",
            "validate: {shapes: [{batch: 1, sequence: 2, past: 3}]}\n",
            "validate.shapes[0].past: unknown dimension (the inputs use: batch, sequence, past_sequence)",
        ),
    ],
)
def test_with_past_recipe_mistakes_are_named(
    tmp_path: Path, task: str, with_past: str, extra: str, message: str
) -> None:
    path = tmp_path / "lm.yaml"
    path.write_text(BASE % (task, with_past) + extra, encoding="utf-8")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert message in str(err.value)


def test_a_local_model_with_a_tokenizer_generates_text_and_run_applies_its_chat_template(tmp_path: Path) -> None:
    """A save_pretrained folder with a (tiny, trained here) tokenizer: the tokenizer is copied
    beside model.onnx, the recipe's text prompt is encoded with it through its chat template
    (the generate step asks as a user would), and ``onnxbuild run`` applies it too."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    text = ["the quick brown fox jumps over the lazy dog", "onnx runs the model", "hello world"] * 20
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if "
        "add_generation_prompt %}<assistant>{% endif %}"
    )
    folder = tmp_path / "tiny-lm"
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(fast), n_positions=64, n_embd=32, n_layer=1, n_head=2, eos_token_id=0, bos_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    recipe = tmp_path / "lm.yaml"
    recipe.write_text(
        "name: tiny-lm\nsource:\n  huggingface: {model: ./tiny-lm, task: text-generation}\nexport: {with_past: true}\n"
        "validate: {shapes: [{batch: 1, sequence: 4}]}\ngenerate: {max_new_tokens: 6, prompt: the quick brown "
        "fox, sampling: null}\n",
        encoding="utf-8",
    )
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([recipe], settings)
    assert report.ok, report.failures()
    art = tmp_path / "artifacts" / "tiny-lm"
    assert (art / "tokenizer.json").is_file() and (art / "tokenizer_config.json").is_file()
    gen = read(art / "reports" / "generation.json")
    assert gen["prompt_ids"] == fast.encode(
        "<user>the quick brown fox<assistant>"
    )  # through the chat template, as a user asks
    assert gen["variants"]["model"]["greedy"]["identical"] is True
    assert gen["variants"]["model"]["text"] == gen["pytorch"]["text"] == fast.decode(gen["pytorch"]["greedy_tokens"])
    result = CliRunner().invoke(cli, ["run", str(art), "--prompt", "hello", "-n", "5", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["chat_template"] is True
    assert payload["prompt_ids"] == fast.encode("<user>hello<assistant>")
    assert isinstance(payload["text"], str)
    plain = CliRunner().invoke(cli, ["run", str(art), "--prompt", "hello", "-n", "5", "--no-chat-template", "--json"])
    assert json.loads(plain.stdout)["prompt_ids"] == fast.encode("hello")


def test_the_web_target_runs_the_variants_meant_for_it_in_onnxruntime_web(built: Path) -> None:
    from onnxbuild import web

    if web.unavailable():
        pytest.skip(f"web target: {web.unavailable()}")
    validation = read(built / "reports" / "validation.json")["variants"]
    for name in ("model", "int8"):
        assert validation[name]["web"].startswith("also validated in onnxruntime-web 1.31.1")
        for case in validation[name]["shapes"]:
            assert case["web"]["passed"] and case["web"]["max_abs_diff_vs_cpu"] < 1e-5, case["web"]
    assert validation["optimized"]["web"] is None and "web" not in validation["optimized"]["shapes"][0]
    bench = read(built / "benchmark.json")
    assert {p["name"]: p["status"] for p in bench["providers"]} == {"CPUExecutionProvider": "used", "web": "used"}
    rows = [r for r in bench["results"] if r["provider"] == "web"]
    assert sorted(r["variant"] for r in rows) == ["int8", "model"] and all(
        r["p50_ms"] > 0 and r["iterations"] == 2 for r in rows
    )
    assert "| model | web |" in (built / "benchmark.md").read_text(encoding="utf-8")


def test_without_node_the_web_target_says_why_it_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from onnxbuild import web

    monkeypatch.setenv("PATH", str(tmp_path))
    assert web.unavailable() == "Node.js is not installed (the web target runs onnxruntime-web under node)"
