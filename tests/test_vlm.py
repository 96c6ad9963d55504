"""Vision-language models (task image-text-to-text, #41): a tiny random-init LLaVA and
Idefics3 built as vision.onnx, embedding.onnx and decoder.onnx, each file validated against
transformers' own part at three shapes (1, 2 and 5 images; 5 over 3 left-padded rows), the
chain against the whole model, greedy generation identical to transformers' generate() with
the image, and ``onnxbuild run --image``; int8, int4 and fp16 variants of the three files (slow).
The step kinds with no way with three files yet refuse the recipe. About 45 s here, one build
of both shared by the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import onnxbuild
from onnxbuild.errors import RecipeError
from onnxbuild.sources.vlm import prompts, split_images, with_images
from tests.helpers_artifacts import signature
from tests.helpers_cli import run as cli

DATA = Path(__file__).resolve().parent / "data" / "vlm"
RECIPE = DATA / "tiny-llava.yaml"
FAMILIES = ("tiny-llava", "tiny-idefics3")
FILES = ("vision.onnx", "embedding.onnx", "decoder.onnx")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build of the tiny LLaVA and Idefics3 recipes (shared: read, don't change)."""
    root = tmp_path_factory.mktemp("vlm")
    for name in FAMILIES:
        shutil.copy(DATA / f"{name}.yaml", root / f"{name}.yaml")
    settings = onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts")
    report = onnxbuild.build([root / f"{name}.yaml" for name in FAMILIES], settings)
    assert report.ok, report.failures()
    return root / "artifacts"


@pytest.fixture
def built(artifacts: Path) -> Path:
    return artifacts / "tiny-llava"


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_a_vision_language_model_is_three_files_in_genai_layout(built: Path) -> None:
    assert not (built / "model.onnx").exists()
    vision, embedding, decoder = (signature(built / f) for f in FILES)
    assert vision == {"pixel_values": ["num_images", 3, 28, 28], "image_features": ["num_image_tokens", 64]}
    assert embedding == {
        "input_ids": ["batch", "sequence"],
        "image_features": ["num_image_tokens", 64],
        "inputs_embeds": ["batch", "sequence", 64],
    }
    assert decoder["inputs_embeds"] == ["batch", "sequence", 64]
    assert decoder["attention_mask"] == ["batch", "total_sequence"] and decoder["position_ids"] == ["batch", "sequence"]
    assert decoder["past_key_values.1.value"] == ["batch", 2, "past_sequence", 16]
    assert decoder["logits"] == ["batch", "sequence", 256] and decoder["present.0.key"][2] == "total_sequence"
    # the merge is NonZero + ScatterND, so a decode step's 0 feature rows are fine
    ops = {n.op_type for n in onnx.load(str(built / "embedding.onnx")).graph.node}
    assert {"NonZero", "ScatterND"} <= ops
    genai = read(built / "genai_config.json")["model"]
    assert genai["type"] == "phi3v" and genai["image_token_id"] == 250
    assert {genai[k]["filename"] for k in ("vision", "embedding", "decoder")} == set(FILES)
    assert genai["vision"]["outputs"] == {"image_features": "image_features"}
    assert genai["embedding"]["inputs"] == {"input_ids": "input_ids", "image_features": "image_features"}
    assert genai["decoder"]["inputs"]["inputs_embeds"] == "inputs_embeds"
    assert genai["decoder"]["num_key_value_heads"] == 2 and genai["vision"]["num_image_tokens"] == 4
    assert (built / "reports" / "check.vision.json").is_file() and (
        built / "reports" / "check.embedding.json"
    ).is_file()


@pytest.mark.parametrize("recipe", FAMILIES)
def test_each_file_and_the_chain_are_validated_at_one_two_and_five_images(artifacts: Path, recipe: str) -> None:
    model = read(artifacts / recipe / "reports" / "validation.json")["variants"]["model"]
    assert model["passed"] and model["top1"]["agreement"] == 1.0
    assert [s["shape"] for s in model["shapes"]] == [
        {"batch": 1, "num_images": 1, "sequence": 1},
        {"batch": 1, "num_images": 2, "sequence": 16},
        {"batch": 3, "num_images": 5, "sequence": 33},
    ]
    for shape in model["shapes"]:
        assert shape["passed"], shape
        outputs = shape["outputs"]
        assert {
            "vision.image_features",
            "embedding.inputs_embeds",
            "embedding.next_step.inputs_embeds",
            "decoder.logits",
            "decoder.present.1.value",
            "decoder.next_step.logits",
            "end_to_end.logits",
        } <= set(outputs)
        assert max(c["max_abs_diff"] for c in outputs.values()) < 1e-4


@pytest.mark.parametrize("recipe", FAMILIES)
def test_greedy_tokens_after_an_image_are_transformers_generate_tokens(artifacts: Path, recipe: str) -> None:
    generation = read(artifacts / recipe / "reports" / "generation.json")
    model = generation["variants"]["model"]
    tokens = generation["pytorch"]["greedy_tokens"]
    assert generation["passed"] and model["greedy"]["identical"] and model["greedy"]["tokens"] == tokens
    assert len(tokens) == 8 and len(set(tokens)) >= 3, tokens  # random weights that say something
    assert generation["prompt_ids"].count(250) == 4  # one image's tokens, after the first
    assert model["greedy"]["logits_max_abs_diff"] < 1e-4 and model["teacher_forced_agreement"] == 1.0
    assert model["sampling"]["identical"]


def test_onnxbuild_run_takes_an_image_and_decodes_as_the_build_did(built: Path, tmp_path: Path) -> None:
    generation = read(built / "reports" / "generation.json")
    # the generate step's image: seeded 8-bit pixels scaled to [-1, 1]
    pixels = np.random.default_rng(0).integers(0, 256, size=(1, 3, 28, 28)).astype(np.float32) / 255.0
    image = tmp_path / "image.npy"
    np.save(image, ((pixels - 0.5) / 0.5).astype(np.float32)[0])
    prompt = " ".join(map(str, generation["prompt_ids"]))
    result = cli("run", str(built), "--image", str(image), "--prompt", prompt, "-n", "8", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["new_ids"] == generation["pytorch"]["greedy_tokens"]
    # one image token stands for the image; a picture is resized to the vision tower's size
    from PIL import Image

    picture = tmp_path / "image.png"
    Image.fromarray(np.zeros((40, 50, 3), dtype=np.uint8)).save(picture)
    result = cli("run", str(built), "--image", str(picture), "--prompt", "1 250 7", "-n", "3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["prompt_ids"] == [1, 250, 250, 250, 250, 7]
    missing = cli("run", str(built), "--prompt", "1 7")
    assert missing.exit_code != 0 and "is a vision-language model; give an image" in missing.output
    np.save(image, np.zeros((3, 14, 14), dtype=np.float32))
    wrong = cli("run", str(built), "--image", str(image), "--prompt", "1 7")
    assert "holds pixel values of shape [1, 3, 14, 14]; this model takes [3, 28, 28]" in wrong.output


def test_a_decode_step_embeds_a_generated_image_token_as_text(built: Path) -> None:
    """0 feature rows replace nothing, as transformers' generate() embeds a generated image token."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(built / "embedding.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[250, 7]], dtype=np.int64)
    (embeds,) = session.run(None, {"input_ids": ids, "image_features": np.zeros((0, 64), dtype=np.float32)})
    (one,) = session.run(None, {"input_ids": ids, "image_features": np.ones((1, 64), dtype=np.float32)})
    assert np.array_equal(embeds[0, 1], one[0, 1]) and not np.array_equal(embeds[0, 0], one[0, 0])
    assert np.array_equal(one[0, 0], np.ones(64, dtype=np.float32))


@pytest.mark.parametrize(
    ("section", "yaml"),
    [
        ("optimize", "optimize: {level: basic}\n"),
        ("benchmark", "benchmark: {}\n"),
    ],
)
def test_kinds_without_a_way_with_three_files_refuse_the_recipe(tmp_path: Path, section: str, yaml: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.read_text(encoding="utf-8") + yaml, encoding="utf-8")
    with pytest.raises(RecipeError) as exc:
        onnxbuild.load_recipe(recipe)
    line = len(RECIPE.read_text(encoding="utf-8").splitlines()) + 1
    assert [str(p) for p in exc.value.problems] == [
        f"{recipe}:{line}:1: {section}: not yet for image-text-to-text (three files); remove {section}"
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "{model_type: qwen2_vl, image_token_id: 250}",
            "source.huggingface.config.model_type: image-text-to-text exports llava, idefics3, smolvlm so far "
            "(got 'qwen2_vl')",
        ),
        (
            "{model_type: llava, vision_config: {model_type: clip_vision_model}}",
            "source.huggingface.config: an image-text-to-text model takes images of its vision tower's one size: "
            "give config.vision_config.image_size (336 for llava-1.5)",
        ),
    ],
)
def test_a_model_the_split_does_not_know_is_refused_at_the_recipe(tmp_path: Path, config: str, message: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: odd\nsource:\n  huggingface:\n    model: x/y\n    task: image-text-to-text\n"
        f"    offline: random-init\n    config: {config}\n",
        encoding="utf-8",
    )
    with pytest.raises(RecipeError) as exc:
        onnxbuild.load_recipe(recipe)
    assert [str(p).split(": ", 1)[1] for p in exc.value.problems] == [message]


@pytest.mark.parametrize(
    ("text", "images", "want"),
    [
        ([1, 5, 6], 1, [1, 9, 9, 5, 6]),  # none: after the first token
        ([1, 9, 5, 9], 2, [1, 9, 9, 5, 9, 9]),  # one per image: each expanded
        ([1, 9, 9, 5], 1, [1, 9, 9, 5]),  # every image's tokens already: kept
    ],
)
def test_a_prompt_gets_its_images_tokens(text: list[int], images: int, want: list[int]) -> None:
    assert with_images(text, images, per_image=2, token=9) == want


def test_rows_with_fewer_images_are_left_padded_as_generate_pads() -> None:
    assert split_images(5, 3) == [2, 2, 1]
    found = prompts([[1, 5], [1, 6], [1, 7]], [2, 2, 1], per_image=1, token=9, pad=0)
    assert found.input_ids.tolist() == [[1, 9, 9, 5], [1, 9, 9, 6], [0, 1, 9, 7]]
    assert found.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    assert found.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [1, 0, 1, 2]]


def test_smolvlm_takes_idefics3s_split() -> None:
    """SmolVLM is Idefics3's architecture under its own type: the same vision path, checked here
    against transformers' own features and whole forward without an export."""
    import torch
    import transformers

    from onnxbuild.sources import vlm

    text = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = transformers.AutoConfig.for_model(
        "smolvlm",
        text_config=text,
        vision_config={**vision, "image_size": 56, "patch_size": 14},
        image_token_id=250,
        scale_factor=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    pixels = torch.from_numpy(vlm.seeded_images(model, 3, seed=0))
    prompt = prompts([[1, 5, 6], [1, 7]], [2, 1], vlm.tokens_per_image(model), 250, pad=0)
    layout = vlm.layout_of(model)
    with torch.no_grad():
        (features,) = vlm.vision_module(model)(pixels)
        assert torch.equal(features, vlm.family(model).reference(model, pixels)) and features.shape == (12, 64)
        ids, mask = torch.from_numpy(prompt.input_ids), torch.from_numpy(prompt.attention_mask)
        positions = torch.from_numpy(prompt.position_ids)
        (embeds,) = vlm.embedding_module(model)(ids, features)
        empty = [torch.zeros((2, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
        logits = vlm.decoder_module(model, layout)(embeds, mask, positions, *empty)[0]
        whole = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, **vlm.family(model).pixels(pixels, [2, 1])
        ).logits
    assert torch.allclose(logits[mask == 1], whole[mask == 1], atol=1e-5)


VARIANTS = """quantize:
  - {name: int8, method: dynamic}
  # random weights give near-flat logits, where 4-bit noise flips argmaxes (0.41 here)
  - {name: int4, method: int4, block_size: 32, validate: {top1_min: 0.3}}
  - {name: static, method: static}
convert:
  - {name: fp16}
"""


def test_a_static_int8_of_three_files_is_refused_at_the_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.read_text(encoding="utf-8") + VARIANTS, encoding="utf-8")
    with pytest.raises(RecipeError) as exc:
        onnxbuild.load_recipe(recipe)
    line = len(RECIPE.read_text(encoding="utf-8").splitlines()) + 5
    assert [str(p) for p in exc.value.problems] == [
        f"{recipe}:{line}:28: quantize[2].method: static calibration of a vision-language model is not "
        "supported; use method: dynamic (or int4)"
    ]


def test_a_smooth_int8_of_three_files_is_refused_at_the_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE.read_text(encoding="utf-8") + "quantize:\n  - {name: s, method: smooth_int8}\n", encoding="utf-8"
    )
    with pytest.raises(RecipeError) as exc:
        onnxbuild.load_recipe(recipe)
    line = len(RECIPE.read_text(encoding="utf-8").splitlines()) + 2
    assert [str(p) for p in exc.value.problems] == [
        f"{recipe}:{line}:15: quantize[0].method: smooth_int8 calibrates on text windows through a decoder: it "
        "applies to text-generation models (for an encoder, use method: dynamic or static)"
    ]


@pytest.mark.slow
def test_int8_int4_and_fp16_variants_quantize_all_three_files_and_are_validated(tmp_path: Path) -> None:
    """Each variant is the three files made the same way (and genai_config.json beside them),
    validated file by file and end to end, and generated from; ``onnxbuild run`` takes one."""
    recipe = tmp_path / "tiny-llava.yaml"
    recipe.write_text(
        RECIPE.read_text(encoding="utf-8") + VARIANTS.replace("  - {name: static, method: static}\n", ""),
        encoding="utf-8",
    )
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([recipe], settings)
    assert report.ok, report.failures()
    built = tmp_path / "artifacts" / "tiny-llava"
    ops = {
        v: {n.op_type for f in FILES for n in onnx.load(str(built / v / f), load_external_data=False).graph.node}
        for v in ("int8", "int4")
    }
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops["int8"] and "MatMulNBits" in ops["int4"]
    for v in ("int8", "int4", "fp16"):
        assert sorted(p.name for p in (built / v).iterdir()) == sorted([*FILES, "genai_config.json"])
    validation = read(built / "reports" / "validation.json")["variants"]
    assert {v: validation[v]["passed"] for v in ("model", "int8", "int4", "fp16")} == dict.fromkeys(
        ("model", "int8", "int4", "fp16"), True
    )
    greedy = read(built / "reports" / "generation.json")["variants"]
    assert [greedy[v]["greedy"]["identical"] for v in ("model", "int8", "fp16")] == [True] * 3
    image = tmp_path / "image.npy"
    np.save(image, np.zeros((3, 28, 28), dtype=np.float32))
    result = cli("run", str(built / "int4"), "--image", str(image), "--prompt", "1 250 7", "-n", "3", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["new_ids"]) == 3
