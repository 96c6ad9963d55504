"""Image to text (task image-to-text): transformers' VisionEncoderDecoderModel, an image encoder
and a text decoder with cross-attention, as an encoder-decoder's two files
(onnxbuild/sources/seq2seq.py). The encoder file maps the image's states to the decoder's width
(enc_to_dec_proj) and projects every decoder layer's cross keys and values from them once; the
decoder file reads those. Validated at three shapes against PyTorch, greedy generation identical
to transformers' generate(), and ``onnxbuild run --image`` decodes as the build did.

The fast test builds the GPT-2 decoder's tiny model (ViT 32 wide, GPT-2 64 wide: about 12 s
here); the TrOCR decoder's, with optimize and int8, is slow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

import onnxbuild
from tests.helpers_artifacts import signature
from tests.helpers_cli import run as cli

DATA = Path(__file__).resolve().parent / "data" / "image-to-text"


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def build(tmp_path: Path, name: str, **more: object) -> Path:
    doc = yaml.safe_load((DATA / f"{name}.yaml").read_text(encoding="utf-8"))
    doc.update(more)
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([recipe], settings)
    assert report.ok, report.failures()
    return tmp_path / "artifacts" / name


def generated_image(folder: Path, recipe: Path, path: Path) -> Path:
    """The generate step's seeded image (its export's sample, batch 1) as a .npy file."""
    from onnxbuild.sources.torchmodel import make_inputs

    resolved = onnxbuild.load_recipe(recipe).resolved
    export = resolved["export"]
    pixels = make_inputs(
        export["inputs"], {**export["sample"], "batch": 1}, seed=resolved["generate"]["seed"], vocab=None
    )["pixel_values"]
    np.save(path, pixels[0])
    return path


def test_a_vit_and_gpt2_captioner_is_two_files_validated_and_generating_as_transformers_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # random-init weights from the recipe's config
    folder = build(tmp_path, "tiny-vit-gpt2")
    encoder, decoder = signature(folder / "encoder_model.onnx"), signature(folder / "decoder_model.onnx")
    # 16 patches and the class token; last_hidden_state is the ViT's own (32 wide), the cross keys
    # and values the decoder's (4 heads x 16) from its states mapped by enc_to_dec_proj
    assert encoder == {
        "pixel_values": ["batch", 3, 32, 32],
        "last_hidden_state": ["batch", 17, 32],
        **{f"present_{kv}_cross_{i}": ["batch", 4, 17, 16] for i in (0, 1) for kv in ("key", "value")},
    }
    assert "encoder_attention_mask" not in decoder and "encoder_hidden_states" not in decoder
    assert decoder["past_key_cross_1"] == ["batch", 4, 17, 16]
    assert decoder["past_key_values.0.key"] == ["batch", 4, "past_sequence", 16]
    assert decoder["logits"] == ["batch", "decoder_sequence", 1000]
    # the decoder's ids lifted onto the outer config, where onnxbuild run reads them
    config = read(folder / "config.json")
    assert (config["vocab_size"], config["decoder_start_token_id"], config["eos_token_id"]) == (1000, 1, 2)

    model = read(folder / "reports" / "validation.json")["variants"]["model"]
    assert [s["shape"] for s in model["shapes"]] == [
        {"batch": 1, "decoder_sequence": 1},
        {"batch": 2, "decoder_sequence": 4},
        {"batch": 5, "decoder_sequence": 9},
    ]
    assert all(s["passed"] for s in model["shapes"]) and model["top1"]["agreement"] == 1.0
    assert max(c["max_abs_diff"] for s in model["shapes"] for c in s["outputs"].values()) < 1e-4
    assert {"encoder.last_hidden_state", "encoder.present_value_cross_1", "decoder.present.1.value"} <= set(
        model["shapes"][2]["outputs"]
    )
    generation = read(folder / "reports" / "generation.json")
    tokens = generation["pytorch"]["greedy_tokens"]
    assert len(tokens) == 8 and len(set(tokens)) >= 3  # random weights that say something
    greedy = generation["variants"]["model"]["greedy"]
    assert greedy["identical"] and greedy["tokens"] == tokens and greedy["logits_max_abs_diff"] < 1e-4

    # onnxbuild run: the generate step's image as a .npy file gives its tokens; no --prompt
    image = generated_image(folder, tmp_path / "tiny-vit-gpt2.yaml", tmp_path / "image.npy")
    result = cli("run", str(folder), "--image", str(image), "-n", "8", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["new_ids"] == tokens
    result = cli("run", str(folder), "--prompt", "5 6")
    assert result.exit_code == 2
    assert f"--image: {folder} is an image-to-text model; give an image (a .npy file or a picture)" in result.output


@pytest.mark.slow
def test_a_trocr_decoder_is_optimized_and_quantized_and_a_picture_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TrOCR's decoder (its cross-attention's keys and values from encoder_attn.k_proj/v_proj,
    learned positions) with optimize and int8: every variant validated and generating. Its
    attention (bmm over [batch x heads, ...], not transformers' attention functions) stays
    MatMul and Softmax; the ViT encoder's is rewritten as Attention."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    doc = yaml.safe_load((DATA / "tiny-vit-trocr.yaml").read_text(encoding="utf-8"))
    doc["source"]["huggingface"]["config"]["decoder"]["use_learned_position_embeddings"] = True
    folder = build(
        tmp_path,
        "tiny-vit-trocr",
        source=doc["source"],
        optimize={"level": "basic", "transformer": {}},
        quantize=[{"name": "int8", "method": "dynamic"}],
    )
    assert signature(folder / "encoder_model.onnx")["present_key_cross_0"] == ["batch", 4, 17, 16]
    validation = read(folder / "reports" / "validation.json")["variants"]
    assert all(validation[v]["passed"] and len(validation[v]["shapes"]) == 3 for v in ("model", "optimized", "int8"))
    generation = read(folder / "reports" / "generation.json")
    for variant in ("model", "optimized"):
        assert generation["variants"][variant]["greedy"]["identical"], variant
    files = read(folder / "reports" / "optimize.json")["files"]
    assert files["encoder_model.onnx"]["attention_rewritten"] == 2
    ops = {n.op_type for n in onnx.load(str(folder / "int8" / "decoder_model.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops
    # a picture, resized to the encoder's 32x32 and scaled to [-1, 1]
    from PIL import Image

    picture = tmp_path / "picture.png"
    Image.fromarray(np.zeros((40, 50, 3), dtype=np.uint8)).save(picture)
    result = cli("run", str(folder), "--image", str(picture), "--variant", "int8", "-n", "4", "--json")
    assert result.exit_code == 0, result.output
    assert 1 <= len(json.loads(result.stdout)["new_ids"]) <= 4
