"""Fused decoder graphs written from the weights (onnxbuild/fusion/decoder.py).

Each supported architecture, as a tiny config of its own transformers class, against
PyTorch at a prefill and a decode step; and a tiny Llama recipe built end to end: its
`optimized` variant holds the fusions (a test names any that stopped firing), validates at
every shape, generates the same greedy tokens as transformers, and quantizes to 4 bits
with int8 compute and lm_head kept in full precision."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from contextlib import chdir
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from click.testing import CliRunner
from onnx import TensorProto, helper

import onnxbuild
from onnxbuild.api import load_recipe
from onnxbuild.cli import cli
from onnxbuild.errors import RecipeError, StepError
from onnxbuild.fusion.decoder import MASKED, build
from tests.helpers_tiny import TINY_DECODER_SIZES

DATA = Path(__file__).resolve().parent / "data"
TINY = TINY_DECODER_SIZES
CONFIGS: dict[str, Any] = {
    "llama": lambda: transformers.LlamaConfig(**TINY),
    "mistral": lambda: transformers.MistralConfig(**TINY, sliding_window=None),
    "mistral-window": lambda: transformers.MistralConfig(**TINY, sliding_window=4),  # shorter than the prompts below
    "qwen2": lambda: transformers.Qwen2Config(**TINY),  # biased q/k/v
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=16),  # per-head q/k norms
    "phi3": lambda: transformers.Phi3Config(**TINY, pad_token_id=0),  # packed qkv and gate_up
    "gemma": lambda: transformers.GemmaConfig(**TINY, head_dim=16),  # (1 + w) norms, scaled embeddings, tanh GELU
    # sandwich norms, alternating window 4 and full layers, soft-capped scores and logits: caps
    # small enough (and weights large enough) that tanh bends them, so a missing cap fails
    "gemma2": lambda: transformers.Gemma2Config(
        **TINY,
        head_dim=16,
        sliding_window=4,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=3.0,
        initializer_range=0.2,
    ),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128),
}


def expected_fusions(family: str, layers: int) -> dict[str, int]:
    if family == "gpt2":
        return {"Attention": layers, "SkipLayerNormalization": 2 * layers, "LayerNormalization": 1, "Gelu": layers}
    return {
        "Attention": layers,
        "RotaryEmbedding": 2 * layers,
        "SkipSimplifiedLayerNormalization": 2 * layers,
        # Gemma 2 also normalises each attention's and MLP's output before its residual add
        "SimplifiedLayerNormalization": 1 + (2 * layers if family == "gemma2" else 0),
    }


def missing_fusions(ops: dict[str, int], expected: dict[str, int]) -> list[str]:
    return [f"{op}: expected {n}, found {ops.get(op, 0)}" for op, n in expected.items() if ops.get(op, 0) != n]


def signature(config: Any) -> onnx.ModelProto:
    """The export's inputs and outputs (what `export.with_past: true` writes) with no nodes."""
    layers = config.num_hidden_layers
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    ins = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", config.vocab_size])]
    for i in range(layers):
        for k in ("key", "value"):
            ins.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{k}", TensorProto.FLOAT, ["batch", kv, "past_sequence", head_dim]
                )
            )
            outs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{k}", TensorProto.FLOAT, ["batch", kv, "total_sequence", head_dim]
                )
            )
    return helper.make_model(helper.make_graph([], "export", ins, outs), opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("family", list(CONFIGS))
def test_each_family_matches_pytorch_at_prefill_and_decode(family: str, tmp_path: Path) -> None:
    config = CONFIGS[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    built = build(model, signature(config))
    assert not missing_fusions(built.fused_ops, expected_fusions(family, 2))
    path = tmp_path / "fused.onnx"
    onnx.save_model(built.model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    layers = config.num_hidden_layers
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rng = np.random.default_rng(0)
    # a windowed family's decode step comes after a past of more than 3 windows (4 here), where
    # its sliding layers read only their window (fusion/decoder._sliding_attention), and is two
    # tokens, so the window's first key is the first query's
    windowed = family in ("mistral-window", "gemma2")
    batch, seq, new = 2, 14 if windowed else 7, 2 if windowed else 1
    ids = rng.integers(0, 1000, (batch, seq))
    past = {
        f"past_key_values.{i}.{k}": np.zeros((batch, kv, 0, head_dim), np.float32)
        for i in range(layers)
        for k in ("key", "value")
    }
    prefill = session.run(
        None,
        {
            "input_ids": ids,
            "attention_mask": np.ones((batch, seq), np.int64),
            "position_ids": np.tile(np.arange(seq), (batch, 1)),
            **past,
        },
    )
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), use_cache=True)
    assert np.abs(prefill[0] - ref.logits.numpy()).max() < 1e-4
    step = rng.integers(0, 1000, (batch, new))
    cache = {
        f"past_key_values.{i}.{k}": prefill[1 + 2 * i + j]
        for i in range(layers)
        for j, k in enumerate(("key", "value"))
    }
    decode = session.run(
        None,
        {
            "input_ids": step,
            "attention_mask": np.ones((batch, seq + new), np.int64),
            "position_ids": np.tile(np.arange(seq, seq + new), (batch, 1)),
            **cache,
        },
    )
    with torch.no_grad():
        ref2 = model(input_ids=torch.tensor(step), past_key_values=ref.past_key_values, use_cache=True)
    assert np.abs(decode[0] - ref2.logits.numpy()).max() < 1e-4
    # the cache layout the export uses, every layer's the whole past + new
    assert {d.shape for d in decode[1:]} == {(batch, kv, seq + new, head_dim)}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_left_padded_batch_matches_pytorch(family: str, tmp_path: Path) -> None:
    """Validation's cases are unpadded; this one pads a row on the left. GroupQueryAttention,
    which these graphs used before, read each row's tokens as a prefix of the cache and came
    out 2.2 off here; ONNX's Attention with the mask from attention_mask and RotaryEmbedding at
    position_ids match PyTorch."""
    config = CONFIGS[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if family == "qwen2":  # transformers initialises biases to zero, which the graph leaves out
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    path = tmp_path / "fused.onnx"
    graph = build(model, signature(config)).model
    biased = [n.name for n in graph.graph.node if n.name.endswith("qkv_proj/Add")]
    assert len(biased) == (config.num_hidden_layers if family in ("qwen2", "gpt2") else 0)
    # every Attention adds a finite mask (MASKED, not the float minimum: a normal float after
    # exp(), so sessions that keep denormals, as this one does, do not slow down on it)
    made = {o: n for n in graph.graph.node for o in n.output}
    # a sliding layer is an If: the plain Attention over the whole past while it is short, and
    # once it is long, an Attention on the last positions (Slice) of the present, which the
    # branch concatenates itself, and of the mask
    ifs = [n for n in graph.graph.node if n.op_type == "If"]
    assert len(ifs) == {"mistral-window": config.num_hidden_layers, "gemma2": 1}.get(family, 0)
    for n in ifs:
        branches = {a.name: a.g for a in n.attribute}
        recent = {o: m for m in branches["then_branch"].node for o in m.output}
        (windowed_attention,) = [m for m in branches["then_branch"].node if m.op_type == "Attention"]
        assert [recent[x].op_type for x in windowed_attention.input[1:4]] == ["Slice"] * 3
        assert [recent[recent[x].input[0]].op_type for x in windowed_attention.input[1:3]] == ["Concat"] * 2
    attention = [n for n in graph.graph.node if n.op_type == "Attention"]
    attention += [m for n in ifs for m in next(a.g for a in n.attribute if a.name == "else_branch").node]
    assert {tuple(n.input[4:6]) for n in attention} == {
        (f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(config.num_hidden_layers)
    }
    masks = [made[n.input[3]] for n in attention]
    windowed = {"mistral-window": ["visible4"], "gemma2": ["visible4", "visible"]}.get(family, ["visible"])
    assert {(m.op_type, *m.input) for m in masks} == {
        ("Where", f"/model/attn_mask/{visible}", "mask_seen", "mask_masked") for visible in windowed
    }
    assert {
        t.name: onnx.numpy_helper.to_array(t).item() for t in graph.graph.initializer if t.name.startswith("mask_")
    } == {"mask_seen": 0.0, "mask_masked": MASKED}
    onnx.save_model(graph, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, (2, 6))
    mask = np.ones((2, 6), np.int64)
    mask[1, :3] = 0  # the second prompt is 3 tokens, padded on the left
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    past = {
        f"past_key_values.{i}.{k}": np.zeros((2, kv, 0, head_dim), np.float32)
        for i in range(config.num_hidden_layers)
        for k in ("key", "value")
    }
    out = session.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past})
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions),
            use_cache=True,
        )
    valid = mask.astype(bool)
    assert np.abs(out[0] - ref.logits.numpy())[valid].max() < 1e-4
    cache = {
        f"past_key_values.{i}.{k}": out[1 + 2 * i + j]
        for i in range(config.num_hidden_layers)
        for j, k in enumerate(("key", "value"))
    }
    step = rng.integers(0, 1000, (2, 1))
    grown = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    decode = session.run(
        None, {"input_ids": step, "attention_mask": grown, "position_ids": positions[:, -1:] + 1, **cache}
    )
    with torch.no_grad():
        ref2 = model(
            input_ids=torch.tensor(step),
            attention_mask=torch.tensor(grown),
            position_ids=torch.tensor(positions[:, -1:] + 1),
            past_key_values=ref.past_key_values,
            use_cache=True,
        )
    assert np.abs(decode[0] - ref2.logits.numpy()).max() < 1e-4


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fused")
    (root / "recipes").mkdir()
    shutil.copy(DATA / "tiny-llama.yaml", root / "recipes" / "tiny-llama.yaml")
    settings = onnxbuild.Settings(cache_dir=root / ".onnxbuild" / "cache", artifacts_dir=root / "artifacts")
    report = onnxbuild.build([root / "recipes" / "tiny-llama.yaml"], settings, jobs=2)
    assert report.ok, report.failures()
    return root / "artifacts" / "tiny-llama"


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_validation_fails_a_graph_that_ignores_left_padding(built: Path, tmp_path: Path) -> None:
    """The unpadded cases cannot tell a graph that reads each row as a prefix (what
    GroupQueryAttention's seqlens_k did) from a right one; validation's left-padded case
    can, so such a regression fails the build, not only the test above."""
    from onnxbuild.pipeline import steps_for
    from onnxbuild.spec import StepContext
    from onnxbuild.steps import validate

    root = built.parent.parent
    recipe = onnxbuild.load_recipes([root / "recipes" / "tiny-llama.yaml"])[0]
    spec = next(s for s in steps_for(recipe) if s.name == "validate.optimized")
    inputs = tmp_path / "inputs"
    for rel in ("reports/source.json", "model.onnx"):
        (inputs / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(built / rel, inputs / rel)
    broken = onnx.load_model(str(built / "optimized" / "model.onnx"))
    for n in broken.graph.node:
        if n.op_type == "Attention":
            n.input[3] = "/model/attn_mask/causal"  # causal only: the padding ignored
    (inputs / "optimized").mkdir()
    onnx.save_model(broken, str(inputs / "optimized" / "model.onnx"))
    ctx = StepContext(
        recipe_name="tiny-llama",
        recipe_path="recipes/tiny-llama.yaml",
        recipe_dir=root / "recipes",
        input_dir=inputs,
        output_dir=tmp_path / "out",
    )
    with pytest.raises(StepError) as failed:
        validate.run(ctx, spec)
    message = str(failed.value)
    assert "failed at shape batch=2, sequence=16, past_sequence=0, left_padding=8: output logits" in message
    assert "worst at [1, " in message  # the padded row, at one of its real tokens
    assert "First node where it parts from model: /model/layers.1/attn/Attention" in message
    assert "--variant optimized --shape 1 --left-padding 8 to search again" in message
    shapes = read(tmp_path / "out" / "reports" / "validation" / "optimized.json")["variants"]["optimized"]["shapes"]
    verdicts: dict[bool, list[bool]] = {False: [], True: []}
    for s in shapes:
        verdicts["left_padding" in s["shape"]].append(s["passed"])
    assert verdicts == {False: [True] * 5, True: [False, False]}
    # the search again, as the message says: it needs the padding to see the difference
    broken_file = str(inputs / "optimized" / "model.onnx")
    args = [
        "explain-mismatch",
        "recipes/tiny-llama.yaml",
        "--variant",
        "optimized",
        "--file",
        broken_file,
        "--shape",
        "1",
        "--out",
        str(tmp_path / "div"),
    ]
    with chdir(root):
        unpadded = CliRunner().invoke(cli, args)
        padded = CliRunner().invoke(cli, [*args, "--left-padding", "8"])
        too_much = CliRunner().invoke(cli, [*args, "--left-padding", "16"])
    assert unpadded.exit_code == 0 and "no divergence" in unpadded.output, unpadded.output
    assert padded.exit_code == 1 and "/model/layers.1/attn/Attention (Attention)" in padded.output, padded.output
    assert (
        too_much.exit_code == 2
        and "--left-padding: 16 must leave a real token in the padded row: between 1 and 15 for "
        "validate.shapes[1] (sequence 16)"
        in too_much.output
    )
    # validate.left_padding: false, for a model never given a padded batch: the same graph
    # passes, and the summary and report say which case was left out
    text = (root / "recipes" / "tiny-llama.yaml").read_text(encoding="utf-8")
    opted_out = root / "recipes" / "tiny-llama-unpadded.yaml"
    opted_out.write_text(text.replace("validate:\n", "validate:\n  left_padding: false\n"), encoding="utf-8")
    spec = next(s for s in steps_for(onnxbuild.load_recipes([opted_out])[0]) if s.name == "validate.optimized")
    assert spec.params["validate"]["left_padding"] is False
    ctx = StepContext(
        recipe_name="tiny-llama",
        recipe_path="recipes/tiny-llama-unpadded.yaml",
        recipe_dir=root / "recipes",
        input_dir=inputs,
        output_dir=tmp_path / "unpadded",
    )
    result = validate.run(ctx, spec)
    assert (
        result.summary.startswith("passed at 5 shapes")
        and "no left-padded batch validated (validate.left_padding: false)" in result.summary
    )
    report = read(tmp_path / "unpadded" / "reports" / "validation" / "optimized.json")["variants"]["optimized"]
    assert report["left_padding"] == validate.LEFT_OUT and not any(
        "left_padding" in s["shape"] for s in report["shapes"]
    )
    assert "optimized: no left-padded batch validated (validate.left_padding: false)." in (
        tmp_path / "unpadded" / "reports" / "validation" / "optimized.md"
    ).read_text(encoding="utf-8")
    # the default stays out of the step's key: recipes written before the key rebuild nothing
    assert "left_padding" not in next(s for s in steps_for(recipe) if s.name == "validate.optimized").params["validate"]


def test_the_first_divergence_search_feeds_each_case_its_validation_inputs(built: Path) -> None:
    """A search (the failure's own, or explain-mismatch's) reproduces the case that failed:
    divergence.feeds_for gives every validation case, padded and decode ones too, the very
    inputs validation gave it, and explain-mismatch finds the seed of its prefill cases."""
    from onnxbuild.pipeline import steps_for
    from onnxbuild.recipe.variants import vocab_size as recipe_vocab
    from onnxbuild.sources.torchmodel import (
        full_export,
        input_specs,
        load_source_model,
        make_inputs,
        vocab_size,
    )
    from onnxbuild.steps.validating.cases import case_seed, cases
    from onnxbuild.steps.validating.divergence import feeds_for

    recipe = onnxbuild.load_recipes([built.parent.parent / "recipes" / "tiny-llama.yaml"])[0]
    params = next(s for s in steps_for(recipe) if s.name == "validate.optimized").params
    model = load_source_model(
        params["source"], read(built / "reports" / "source.json"), built.parent.parent / "recipes"
    )
    export = full_export(params["export"], model)
    specs = input_specs(params["source"], export, natural=True)
    vocab = vocab_size(model)
    assert vocab == recipe_vocab(recipe) == 1000
    all_cases = cases(params["validate"]["shapes"], True, padded=True)
    assert len(all_cases) == 7
    for i, sizes in enumerate(all_cases):
        validation = make_inputs(specs, sizes, seed=i, vocab=vocab)
        search = feeds_for(built / "optimized" / "model.onnx", sizes, seed=i, vocab=vocab)
        assert sorted(search) == sorted(validation), sizes
        for name, value in validation.items():
            assert search[name].dtype == value.dtype and np.array_equal(search[name], value), (sizes, name)
        prefill = sizes.get("past_sequence") == 0
        asked = {k: v for k, v in sizes.items() if k != "past_sequence"}
        assert case_seed(params["validate"], recipe.resolved["export"], asked if prefill else sizes) == i
    assert (
        case_seed(params["validate"], recipe.resolved["export"], {"batch": 2, "sequence": 16, "left_padding": 3})
        is None
    )


def test_the_llama_fusions_fire_and_are_reported(built: Path) -> None:
    report = read(built / "reports" / "optimize.json")
    assert report["decoder"]["graph"] == "fused" and report["decoder"]["family"] == "llama"
    ops = Counter(
        n.op_type for n in onnx.load_model(str(built / "optimized" / "model.onnx"), load_external_data=False).graph.node
    )
    # counted in the file itself, not only in the report: a transformers or onnxruntime
    # upgrade that breaks a fusion fails here with the fusion's name
    assert missing_fusions(dict(ops), expected_fusions("llama", 2)) == []
    assert report["fused_ops"] == expected_fusions("llama", 2)
    assert ops["MatMul"] == 2 * 5 + 1  # per layer: packed QKV, output projection, gate, up, down; and lm_head
    assert "GroupQueryAttention" not in ops and "Softmax" not in ops


def test_the_fused_graph_has_the_exports_signature_and_passes_validation_and_generation(built: Path) -> None:
    def io(path: Path) -> tuple[list[str], list[str]]:
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return [f"{i.name}:{i.type}:{i.shape}" for i in s.get_inputs()], [
            f"{o.name}:{o.type}:{o.shape}" for o in s.get_outputs()
        ]

    assert io(built / "optimized" / "model.onnx") == io(built / "model.onnx")
    validation = read(built / "reports" / "validation.json")["variants"]["optimized"]
    assert (
        validation["passed"] and len(validation["shapes"]) == 7
    )  # prefill and decode at each shape, a past of 40, and a left-padded batch
    assert max(c["max_abs_diff"] for s in validation["shapes"] for c in s["outputs"].values()) < 1e-4
    gen = read(built / "reports" / "generation.json")
    assert gen["variants"]["optimized"]["greedy"]["identical"] is True
    assert gen["variants"]["optimized"]["greedy"]["tokens"] == gen["pytorch"]["greedy_tokens"]
    assert 0.0 <= gen["variants"]["int4"]["teacher_forced_agreement"] <= 1.0  # 4-bit agreement reported


def test_int4_multiplies_in_int8_keeps_lm_head_in_full_precision_and_packs_the_embedding(built: Path) -> None:
    model = onnx.load_model(str(built / "int4" / "model.onnx"), load_external_data=False)
    (embed,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]  # quantize.embedding: true
    assert {a.name: helper.get_attribute_value(a) for a in embed.attribute}["block_size"] == 32
    assert not [
        n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in {i.name for i in model.graph.initializer}
    ]
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 * 5  # every layer's five MatMuls
    for n in nbits:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["accuracy_level"] == 4 and attrs["block_size"] == 32 and attrs["bits"] == 4
    (head,) = [n for n in model.graph.node if n.name.startswith("/lm_head/")]
    assert head.op_type == "MatMul"


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (
            "name: x\nsource: {huggingface: {model: m, task: feature-extraction, offline: random-init, config: "
            "{model_type: bert}}}\noptimize: {decoder: fused}\n",
            "optimize.decoder: fused graphs are for text-generation models exported with export.with_past: true; "
            "use decoder: auto or export",
        ),
        (
            "name: x\nsource: {huggingface: {model: m, task: text-generation, offline: random-init, config: "
            "{model_type: falcon}}}\nexport: {with_past: true}\noptimize: {decoder: fused}\n",
            "optimize.decoder: no fused graph for model_type 'falcon' (there is one for llama, mistral, qwen2, "
            "qwen3, phi3, gemma, gemma2, gpt2); use decoder: auto or export",
        ),
        (
            "name: x\nsource: {huggingface: {model: m, task: text-generation, offline: random-init, config: "
            "{model_type: llama}}}\nexport: {with_past: true}\noptimize: {decoder: fast}\n",
            'r.yaml:4:21: optimize.decoder: must be auto, fused or export (got "fast")',
        ),
    ],
)
def test_fused_decoder_recipe_mistakes_are_named(recipe: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(recipe, encoding="utf-8")
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert any(message in str(p) for p in exc.value.problems), [str(p) for p in exc.value.problems]


def test_a_keep_that_names_no_layer_fails_the_step_naming_it(built: Path, tmp_path: Path) -> None:
    root = built.parent.parent
    recipe = root / "recipes" / "typo.yaml"
    text = (
        (root / "recipes" / "tiny-llama.yaml")
        .read_text(encoding="utf-8")
        .replace("name: tiny-llama", "name: typo")
        .replace("keep: [lm_head]", "keep: [lm_hed]")
    )
    recipe.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(
        cli,
        [
            "--cache-dir",
            str(root / ".onnxbuild" / "cache"),
            "--artifacts-dir",
            str(tmp_path),
            "make",
            str(recipe),
            "--target",
            "quantize.int4",
        ],
    )
    assert result.exit_code == 1
    assert "quantize.int4.keep: 'lm_hed' is in no MatMul, Gemm or Gather node's name" in result.output
