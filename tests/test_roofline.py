"""Work per call, machine peaks and the roofline (onnxbuild/steps/roofline.py).

Every graph here is a few nodes built with onnx.helper; the ones with contrib ops are run
once in ONNX Runtime first, so the counts are of graphs ORT accepts. Expected FLOPs are
written out by hand (2 per multiply-add), never computed by the module under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxbuild.environment import cpu_info
from onnxbuild.steps.graphwork import graph_work
from onnxbuild.steps.peaks import measure_peaks
from onnxbuild.steps.roofline import Peaks, Work, roofline

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, list[Any]]],
    outputs: list[str],
    weights: dict[str, np.ndarray],
) -> onnx.ModelProto:
    """A graph of ``nodes``: inputs by name -> (element type, dims), float outputs of unknown shape."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, d) for n, (t, d) in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )  # fmt: skip
    # IR 10: what the installed onnxruntime reads (onnx's default may be newer)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], ir_version=10
    )


def run_in_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- graph_work ---------------------------------------------------------------------------


def test_a_matmul_with_symbolic_batch_and_sequence() -> None:
    m = model(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        {"X": (TensorProto.FLOAT, ["batch", "seq", 64])},
        ["Y"],
        {"W": floats(64, 32)},
    )
    work = graph_work(m, {"X": (2, 8, 64)})
    # [2, 8, 64] x [64, 32]: 2 * 8 rows, each 64 multiply-adds for each of 32 columns
    assert work.flops == 2 * (2 * 8) * 64 * 32 == 65536
    assert work.weight_bytes == 64 * 32 * 4
    assert work.by_op == {"MatMul": 65536}
    assert work.uncounted == ()
    assert json.loads(json.dumps(work.as_dict())) == {
        "flops": 65536,
        "weight_bytes": 8192,
        "by_op": {"MatMul": 65536},
        "uncounted": [],
    }


def test_an_embedding_table_counts_the_rows_its_indices_pick() -> None:
    ids = {"ids": (TensorProto.INT64, ["batch", "seq"])}
    alone = model([helper.make_node("Gather", ["E", "ids"], ["Y"])], ids, ["Y"], {"E": floats(100, 8)})
    # [2, 5] indices: 10 rows of 8 float32 are read, not the whole 100-row table
    assert graph_work(alone, {"ids": (2, 5)}).weight_bytes == 10 * 8 * 4
    # tied to an output projection (GPT-2's lm_head): the MatMul reads the table whole
    tied = model(
        [
            helper.make_node("Gather", ["E", "ids"], ["H"]),
            helper.make_node("Transpose", ["E"], ["Et"]),
            helper.make_node("MatMul", ["H", "Et"], ["Y"]),
        ],
        ids, ["Y"], {"E": floats(100, 8)},
    )  # fmt: skip
    assert graph_work(tied, {"ids": (2, 5)}).weight_bytes == 100 * 8 * 4


def test_gemm_with_transposed_b_counts_the_bias_bytes_not_its_flops() -> None:
    node = helper.make_node("Gemm", ["A", "B", "C"], ["Y"], transB=1)
    m = model([node], {"A": (TensorProto.FLOAT, ["m", 48])}, ["Y"], {"B": floats(24, 48), "C": floats(24)})
    work = graph_work(m, {"A": (5, 48)})
    # A [5, 48] x B^T [48, 24]
    assert work.flops == 2 * 5 * 48 * 24
    assert work.weight_bytes == (24 * 48 + 24) * 4


def test_a_grouped_strided_conv() -> None:
    node = helper.make_node("Conv", ["X", "W", "b"], ["Y"], group=2, strides=[2, 2], pads=[1, 1, 1, 1])
    m = model([node], {"X": (TensorProto.FLOAT, ["n", 6, "h", "w"])}, ["Y"], {"W": floats(8, 3, 3, 3), "b": floats(8)})
    work = graph_work(m, {"X": (1, 6, 10, 12)})
    # output [1, 8, 5, 6]: height (10 + 2 - 3) // 2 + 1 = 5, width (12 + 2 - 3) // 2 + 1 = 6;
    # each output point: 6 / 2 groups = 3 input channels x a 3x3 kernel
    out_h, out_w = (10 + 2 - 3) // 2 + 1, (12 + 2 - 3) // 2 + 1
    assert (out_h, out_w) == (5, 6)
    assert work.flops == 2 * (1 * 8 * out_h * out_w) * (3 * 3 * 3) == 12960
    assert work.weight_bytes == (8 * 3 * 3 * 3 + 8) * 4


def test_matmulnbits_counts_k_by_n_per_row_and_its_packed_bytes() -> None:
    k, n, block = 64, 32, 32
    blocks = k // block
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "scales", "zero_points"], ["Y"], domain=MS, K=k, N=n, bits=4, block_size=block
    )
    weights = {
        "B": RNG.integers(0, 256, (n, blocks, block * 4 // 8), dtype=np.uint8),  # two 4-bit values a byte
        "scales": floats(n * blocks),
        "zero_points": RNG.integers(0, 256, (n * math.ceil(blocks * 4 / 8),), dtype=np.uint8),
    }
    m = model([node], {"A": (TensorProto.FLOAT, ["batch", "seq", k])}, ["Y"], weights)
    assert run_in_ort(m, {"A": floats(2, 3, k)})[0].shape == (2, 3, n)
    work = graph_work(m, {"A": (2, 3, k)})
    assert work.flops == 2 * (2 * 3) * 64 * 32
    # stored bytes: 32 x 2 blocks x 16 bytes, 64 float scales, 32 zero-point bytes
    assert work.weight_bytes == 32 * 2 * 16 + 64 * 4 + 32 == 1312


def scalar(name: str, dtype: type[np.generic]) -> dict[str, np.ndarray]:
    return {name: np.array(1 if dtype is np.float32 else 0, dtype)}


QUANTIZED_AND_FUSED = {
    # op: (node, A's element type, weights)
    "MatMulInteger": (helper.make_node("MatMulInteger", ["A", "B"], ["Y"]), TensorProto.UINT8, {}),
    "QLinearMatMul": (
        helper.make_node("QLinearMatMul", ["A", "sa", "za", "B", "sb", "zb", "sy", "zy"], ["Y"]),
        TensorProto.UINT8,
        {
            **scalar("sa", np.float32),
            **scalar("za", np.uint8),
            **scalar("sb", np.float32),
            **scalar("zb", np.int8),
            **scalar("sy", np.float32),
            **scalar("zy", np.uint8),
        },
    ),
    "DynamicQuantizeMatMul": (
        helper.make_node("DynamicQuantizeMatMul", ["A", "B", "sb"], ["Y"], domain=MS),
        TensorProto.FLOAT,
        scalar("sb", np.float32),
    ),
    "MatMulIntegerToFloat": (
        helper.make_node("MatMulIntegerToFloat", ["A", "B", "sa", "sb"], ["Y"], domain=MS),
        TensorProto.UINT8,
        {**scalar("sa", np.float32), **scalar("sb", np.float32)},
    ),
    "FusedMatMul": (
        helper.make_node("FusedMatMul", ["A", "Bt"], ["Y"], domain=MS, transB=1, alpha=0.5),
        TensorProto.FLOAT,
        {},
    ),
}


@pytest.mark.parametrize("op", sorted(QUANTIZED_AND_FUSED))
def test_quantized_and_fused_matmuls_count_from_their_inputs(op: str) -> None:
    """ORT's symbolic inference leaves most of these outputs unknown: the count reads A and B."""
    node, a_type, weights = QUANTIZED_AND_FUSED[op]
    b = {"Bt": floats(3, 24, 16)} if op == "FusedMatMul" else {"B": RNG.integers(-8, 8, (3, 16, 24), dtype=np.int8)}
    m = model([node], {"A": (a_type, ["n", 5, 16])}, [], {**b, **weights})
    m.graph.output.append(
        helper.make_tensor_value_info(
            "Y",
            TensorProto.UINT8
            if op == "QLinearMatMul"
            else TensorProto.INT32
            if op == "MatMulInteger"
            else TensorProto.FLOAT,
            None,
        )
    )
    a = floats(1, 5, 16) if a_type == TensorProto.FLOAT else RNG.integers(0, 256, (1, 5, 16), dtype=np.uint8)
    assert run_in_ort(m, {"A": a})[0].shape == (3, 5, 24)
    # A [1, 5, 16] broadcast against B's batch of 3: [3, 5, 16] x [3, 16, 24]
    assert graph_work(m, {"A": (1, 5, 16)}).by_op == {op: 2 * 3 * 5 * 16 * 24}


def gqa_model(packed: bool) -> onnx.ModelProto:
    """GroupQueryAttention (4 query heads, 2 key-value heads of 16) and an output projection
    behind it: counting that MatMul needs the shape inferred through the contrib op."""
    heads, kv_heads, head = 4, 2, 16
    qkv = ["qkv", "", ""] if packed else ["q", "k", "v"]
    nodes = [
        helper.make_node(
            "GroupQueryAttention",
            [*qkv, "past_key", "past_value", "seqlens_k", "total_len"],
            ["attn", "present_key", "present_value"],
            domain=MS,
            num_heads=heads,
            kv_num_heads=kv_heads,
        ),
        helper.make_node("MatMul", ["attn", "Wo"], ["out"]),
    ]
    f = TensorProto.FLOAT
    inputs: dict[str, tuple[int, list[Any]]] = (
        {"qkv": (f, ["b", "s", (heads + 2 * kv_heads) * head])}
        if packed
        else {
            "q": (f, ["b", "s", heads * head]),
            "k": (f, ["b", "s", kv_heads * head]),
            "v": (f, ["b", "s", kv_heads * head]),
        }
    )
    inputs |= {
        "past_key": (f, ["b", kv_heads, "p", head]),
        "past_value": (f, ["b", kv_heads, "p", head]),
        "seqlens_k": (TensorProto.INT32, ["b"]),
        "total_len": (TensorProto.INT32, []),
    }
    return model(nodes, inputs, ["out", "present_key", "present_value"], {"Wo": floats(heads * head, heads * head)})


@pytest.mark.parametrize("packed", [False, True], ids=["q-k-v", "packed-qkv"])
@pytest.mark.parametrize(
    ("batch", "seq", "past"), [(1, 3, 5), (2, 1, 5), (1, 4, 0)], ids=["prefill-after-past", "decode", "prefill"]
)
def test_group_query_attention_counts_both_products_over_past_and_new_tokens(
    packed: bool, batch: int, seq: int, past: int
) -> None:
    m = gqa_model(packed)
    shapes: dict[str, tuple[int, ...]] = (
        {"qkv": (batch, seq, 128)} if packed else {"q": (batch, seq, 64), "k": (batch, seq, 32), "v": (batch, seq, 32)}
    )
    shapes |= {
        "past_key": (batch, 2, past, 16),
        "past_value": (batch, 2, past, 16),
        "seqlens_k": (batch,),
        "total_len": (),
    }
    feeds = {name: floats(*dims) for name, dims in shapes.items() if name not in ("seqlens_k", "total_len")}
    out, present_key, _ = run_in_ort(
        m,
        {
            **feeds,
            "seqlens_k": np.full((batch,), past + seq - 1, np.int32),
            "total_len": np.array(past + seq, np.int32),
        },
    )
    assert out.shape == (batch, seq, 64) and present_key.shape == (batch, 2, past + seq, 16)

    work = graph_work(m, shapes)
    # QK^T and softmax x V: 4 heads of 16, each query token against past + new tokens
    assert work.by_op["GroupQueryAttention"] == 2 * batch * 4 * seq * (past + seq) * 16 * 2
    assert work.by_op["MatMul"] == 2 * (batch * seq) * 64 * 64
    assert work.uncounted == ()


def other_attention(kind: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], int]:
    """(model, feeds, expected FLOPs): batch 2, 3 new tokens, 4 past ones, heads of 8."""
    b, s, p = 2, 3, 4
    f = TensorProto.FLOAT
    if kind == "MultiHeadAttention":  # 4 heads, a past of 4 tokens
        node = helper.make_node(
            "MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "prk", "prv"], domain=MS, num_heads=4
        )
        feeds = {
            "q": floats(b, s, 32),
            "k": floats(b, s, 32),
            "v": floats(b, s, 32),
            "pk": floats(b, 4, p, 8),
            "pv": floats(b, 4, p, 8),
        }
        return (
            model([node], {n: (f, list(a.shape)) for n, a in feeds.items()}, ["o", "prk", "prv"], {}),
            feeds,
            2 * b * 4 * s * (p + s) * 8 * 2,
        )
    if kind == "Attention (com.microsoft)":  # the QKV projection [32] -> [96] and 4 heads, no past
        node = helper.make_node("Attention", ["x", "w", "bias"], ["o"], domain=MS, num_heads=4)
        feeds = {"x": floats(b, s, 32)}
        return (
            model([node], {"x": (f, [b, s, 32])}, ["o"], {"w": floats(32, 96), "bias": floats(96)}),
            feeds,
            2 * b * s * 32 * 96 + 2 * b * 4 * s * s * 8 * 2,
        )
    # ONNX's own (opset 23): 4 query heads over 2 key-value heads with a past
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["o", "prk", "prv"])
    feeds = {
        "q": floats(b, 4, s, 8),
        "k": floats(b, 2, s, 8),
        "v": floats(b, 2, s, 8),
        "pk": floats(b, 2, p, 8),
        "pv": floats(b, 2, p, 8),
    }
    m = model([node], {n: (f, list(a.shape)) for n, a in feeds.items()}, ["o", "prk", "prv"], {})
    m.opset_import[0].version = 23
    return m, feeds, 2 * b * 4 * s * (p + s) * 8 * 2


@pytest.mark.parametrize("kind", ["MultiHeadAttention", "Attention (com.microsoft)", "Attention (opset 23)"])
def test_other_attention_ops(kind: str) -> None:
    m, feeds, expected = other_attention(kind)
    run_in_ort(m, feeds)
    work = graph_work(m, {})
    assert (work.flops, work.uncounted) == (expected, ())


def test_onnx_attention_then_a_contrib_op_then_a_matmul() -> None:
    """ORT's symbolic inference takes every Attention for its contrib op: ONNX's own (3-D
    inputs, head counts as attributes, GPT-2's fused graph) must not stop it before a contrib op
    (FastGelu) that only it knows, or the MatMul after that goes uncounted."""
    b, s, p = 1, 5, 3
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node(
            "Attention", ["q", "k", "v", "", "pk", "pv"], ["o", "prk", "prv"], q_num_heads=4, kv_num_heads=4
        ),
        helper.make_node("FastGelu", ["o"], ["g"], domain=MS),
        helper.make_node("MatMul", ["g", "W"], ["Y"]),
    ]
    feeds = {
        "q": floats(b, s, 32),
        "k": floats(b, s, 32),
        "v": floats(b, s, 32),
        "pk": floats(b, 4, p, 8),
        "pv": floats(b, 4, p, 8),
    }
    m = model(nodes, {n: (f, list(a.shape)) for n, a in feeds.items()}, ["Y", "prk", "prv"], {"W": floats(32, 16)})
    m.opset_import[0].version = 23
    run_in_ort(m, feeds)
    work = graph_work(m, {})
    assert work.uncounted == ()
    assert work.by_op == {"Attention": 2 * b * 4 * s * (p + s) * 8 * 2, "MatMul": 2 * b * s * 32 * 16}


def test_a_file_with_every_tensor_external(tmp_path: Path) -> None:
    """Weights stay on disk; the Reshape's shape (external too) is read, so the second MatMul resolves."""
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"]),
        helper.make_node("Reshape", ["h", "to"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["Y"]),
    ]
    m = model(
        nodes,
        {"X": (TensorProto.FLOAT, ["b", 16])},
        ["Y"],
        {"W1": floats(16, 64), "to": np.array([-1, 32], np.int64), "W2": floats(32, 8)},
    )
    onnx.save(
        m,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    work = graph_work(tmp_path / "m.onnx", {"X": (3, 16)})
    # [3, 16] x [16, 64], reshaped to [6, 32], x [32, 8]
    assert work.by_op == {"MatMul": 2 * 3 * 16 * 64 + 2 * 6 * 32 * 8}
    assert work.weight_bytes == (16 * 64 + 32 * 8) * 4 + 2 * 8
    assert work.uncounted == ()


def mystery_then_matmul() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mystery", ["X"], ["m"], domain="com.example"),
        helper.make_node("MatMul", ["m", "W"], ["Y"]),
    ]
    m = model(nodes, {"X": (TensorProto.FLOAT, ["b", 16])}, ["Y"], {"W": floats(16, 8)})
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return m


@pytest.mark.parametrize(
    ("m", "shapes"),
    [
        (
            model(
                [helper.make_node("MatMul", ["X", "W"], ["Y"])],
                {"X": (TensorProto.FLOAT, ["b", 16])},
                ["Y"],
                {"W": floats(16, 8)},
            ),
            {},
        ),
        (mystery_then_matmul(), {"X": (4, 16)}),
        (
            model(
                [helper.make_node("Einsum", ["A", "B", "C"], ["Y"], equation="ij,jk,kl->il")],
                {n: (TensorProto.FLOAT, [4, 4]) for n in "ABC"},
                ["Y"],
                {},
            ),
            {},
        ),
    ],
    ids=["input-not-given", "after-an-unknown-op", "three-operand-einsum"],
)
def test_unresolved_shapes_are_named_not_guessed(m: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    work = graph_work(m, shapes)
    assert work.flops == 0
    assert work.uncounted == (m.graph.node[-1].op_type,)


def test_a_two_operand_einsum_with_a_batch_ellipsis() -> None:
    node = helper.make_node("Einsum", ["A", "B"], ["Y"], equation="...ij,...jk->...ik")
    m = model([node], {"A": (TensorProto.FLOAT, [2, 3, 5, 7]), "B": (TensorProto.FLOAT, [1, 3, 7, 4])}, ["Y"], {})
    assert graph_work(m, {}).flops == 2 * (2 * 3) * 5 * 7 * 4


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"X": (2, 8, 64), "mask": (2, 8)}, "shapes: 'mask' is not an input of the graph (inputs: X)"),
        ({"X": (16, 64)}, "shapes['X']: the input has rank 3, got (16, 64)"),
        ({"X": (2, 8, 32)}, "shapes['X']: dimension 2 of the input is fixed at 64, got (2, 8, 32)"),
    ],
)
def test_shapes_that_do_not_fit_the_graph(shapes: dict[str, tuple[int, ...]], message: str) -> None:
    m = model(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        {"X": (TensorProto.FLOAT, ["batch", "seq", 64])},
        ["Y"],
        {"W": floats(64, 32)},
    )
    with pytest.raises(ValueError) as e:
        graph_work(m, shapes)
    assert str(e.value) == message


# -- roofline -----------------------------------------------------------------------------

PEAKS = Peaks(
    fp32_gflops=100.0, bf16_gflops=None, int8_gops=400.0, memory_gbps=20.0, threads=2, how={"fp32_gflops": "given"}
)


def test_a_memory_bound_decode() -> None:
    work = Work(flops=2 * 10**9, weight_bytes=10**9)
    r = roofline(work, time_ms=100.0, precision="int4", peaks=PEAKS, phase="decode")
    # int8 compute: 2e9 / 400e9 = 5 ms; memory: 1e9 B / 20e9 B/s = 50 ms, the larger
    assert r.as_dict() == {
        "gflops": 20.0,
        "gbps": 10.0,
        "bound": "memory",
        "limit": "memory bandwidth",
        "fraction": 0.5,
        "min_ms": 50.0,
    }
    assert r.describe() == "int4 decode: 50% of memory bandwidth"


def test_a_compute_bound_prefill() -> None:
    work = Work(flops=4 * 10**11, weight_bytes=10**9)
    r = roofline(work, time_ms=8000.0, precision="fp32", peaks=PEAKS, phase="prefill")
    # fp32 compute: 4e11 / 100e9 = 4 s; memory 50 ms
    assert (r.bound, r.limit, r.min_ms, r.fraction, r.gflops) == ("compute", "fp32 GEMM", 4000.0, 0.5, 50.0)
    assert r.describe() == "fp32 prefill: 50% of fp32 GEMM"


@pytest.mark.parametrize(
    ("precision", "limit"),
    [
        ("fp32", "fp32 GEMM"),
        ("fp16", "fp32 GEMM"),
        ("bf16", "fp32 GEMM"),
        ("int8", "int8 GEMM"),
        ("uint8", "int8 GEMM"),
        ("int4", "int8 GEMM"),
    ],
)
def test_the_compute_limit_follows_the_precision(precision: str, limit: str) -> None:
    """bf16 falls back to fp32 where the CPU has no bf16 peak (PEAKS has none)."""
    r = roofline(Work(flops=10**12, weight_bytes=0), time_ms=1000.0, precision=precision, peaks=PEAKS, phase="")
    assert r.limit == limit
    assert r.min_ms == (10**12 / 400e9 if limit == "int8 GEMM" else 10**12 / 100e9) * 1e3


def test_the_fraction_is_not_clamped_and_a_lower_bound_says_so() -> None:
    r = roofline(
        Work(flops=0, weight_bytes=3 * 10**8, uncounted=("Einsum",)),
        time_ms=10.0,
        precision="bf16",
        peaks=PEAKS,
        phase="",
    )
    # 3e8 B / 20e9 B/s = 15 ms in 10 ms: the peak was measured low
    assert (r.fraction, r.bound) == (1.5, "memory")
    assert r.describe() == "bf16: 150% of memory bandwidth (at least: Einsum not counted)"


def test_peaks_round_trip_through_json() -> None:
    assert Peaks.from_dict(json.loads(json.dumps(PEAKS.as_dict()))) == PEAKS


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fp32_gflops": None}, "peaks.fp32_gflops: must be a positive number (got None)"),
        ({"int8_gops": "fast"}, "peaks.int8_gops: must be a positive number or null (got 'fast')"),
        ({"threads": 0}, "peaks.threads: must be a positive integer (got 0)"),
    ],
)
def test_bad_peaks(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as e:
        Peaks.from_dict({**PEAKS.as_dict(), **change})
    assert str(e.value) == message


def test_measure_peaks_measures_what_the_cpu_has() -> None:
    flags = set(cpu_info()[1].split())
    peaks = measure_peaks(threads=1, budget_s=0.2)
    assert peaks.threads == 1
    assert peaks.fp32_gflops > 0 and peaks.memory_gbps > 0
    has_bf16 = bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    has_int8 = bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"})
    assert (peaks.bf16_gflops is not None, peaks.int8_gops is not None) == (has_bf16, has_int8)
    assert all(v is None or v > 0 for v in (peaks.bf16_gflops, peaks.int8_gops))
    assert set(peaks.how) == {"fp32_gflops", "bf16_gflops", "int8_gops", "memory_gbps"}
