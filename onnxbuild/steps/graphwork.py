"""The work of one call, counted from the graph at concrete input shapes (``graph_work``): the
matrix products' FLOPs and the weight bytes read, for the roofline in steps/roofline.py (whose
header says what is counted and why it is enough).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
from onnxbuild.steps.graphshapes import SMALL_INITIALIZER, Shape, inferred_shapes, light_copy, resolved
from onnxbuild.steps.roofline import Work

MATMULS = {
    "MatMul": 1,
    "MatMulInteger": 1,
    "QLinearMatMul": 3,
    "FusedMatMul": 1,
    "DynamicQuantizeMatMul": 1,
    "MatMulIntegerToFloat": 1,
}
"""Matrix products with numpy's broadcasting, and where each takes its B (A is input 0)."""


CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}
"""Where each convolution takes its weight [C_out, C_in / group, *kernel]."""


NOT_MODELLED = frozenset({
    "QAttention", "QOrderedAttention", "DecoderMaskedMultiHeadAttention", "DecoderMaskedSelfAttention",
    "DecoderAttention", "PackedAttention", "PackedMultiHeadAttention", "LongformerAttention",
    "SparseAttention", "PagedAttention",
    "LSTM", "GRU", "RNN", "NhwcConv", "ConvTranspose", "QLinearConvTranspose", "GemmFastGelu", "QGemm",
})  # fmt: skip
"""Ops with heavy math that are not counted: named in ``uncounted`` when the graph has them."""


HEAVY = frozenset(
    {
        *MATMULS,
        *CONV_WEIGHT,
        *NOT_MODELLED,
        "Gemm",
        "MatMulNBits",
        "Attention",
        "MultiHeadAttention",
        "GroupQueryAttention",
        "Einsum",
    }
)


def graph_work(model_or_path: onnx.ModelProto | str | os.PathLike[str], shapes: Mapping[str, Sequence[int]]) -> Work:
    """The matrix-product FLOPs and weight bytes of one call of a graph.

    Args:
        model_or_path: the model, or its file (external data is read only for the small
            tensors shape inference needs).
        shapes: the concrete shape of each graph input for the call, by name. An input left
            out stays symbolic, and the ops it reaches are named in ``uncounted``.

    Returns:
        The work, with ``uncounted`` empty when every counted op's shapes were resolved.

    Raises:
        ValueError: a name in ``shapes`` is no graph input, or a shape contradicts the
            input's rank or a fixed dimension.

    Example:
        >>> graph_work("model.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)}).by_op
        {'MatMul': 2868903936}
    """  # noqa: E501
    import onnx.inliner

    model = _load(model_or_path)
    weight_bytes = sum(_stored_bytes(t) for t in model.graph.initializer)
    weight_bytes += sum(
        _stored_bytes(a.t)
        for n in model.graph.node
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
        for a in n.attribute
        if a.name == "value"
    )
    light = light_copy(model, shapes)
    if light.functions:
        light = onnx.inliner.inline_local_functions(light)
    known = inferred_shapes(light)
    known.update((t.name, tuple(t.dims)) for t in model.graph.initializer)
    weight_bytes -= _unread_table_bytes(model.graph, known)

    by_op: dict[str, int] = {}
    uncounted: set[str] = set()
    for node in light.graph.node:
        if node.op_type in NOT_MODELLED:
            uncounted.add(node.op_type)
            continue
        uncounted |= {
            n.op_type
            for a in node.attribute
            for g in (*a.graphs, *([a.g] if a.HasField("g") else []))
            for n in g.node
            if n.op_type in HEAVY
        }
        try:
            flops = _node_flops(node, known)
        except _Unresolved:
            uncounted.add(node.op_type)
            continue
        if flops:
            by_op[node.op_type] = by_op.get(node.op_type, 0) + flops
    return Work(sum(by_op.values()), weight_bytes, dict(sorted(by_op.items())), tuple(sorted(uncounted)))


def _unread_table_bytes(graph: onnx.GraphProto, known: Mapping[str, tuple[int | None, ...] | None]) -> int:
    """Bytes of lookup tables a call does not read: an initializer that only Gathers take (an
    embedding) is read one row per index, not whole. A table any other op reads (a tied
    lm_head's MatMul, int8's DequantizeLinear of the whole table) is read whole."""
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            users.setdefault(name, []).append((node, i))
    unread = 0
    for t in graph.initializer:
        uses = users.get(t.name, [])
        if (
            not uses
            or len(t.dims) < 2
            or not all(
                n.op_type == "Gather" and i == 0 and not any(a.name == "axis" and a.i != 0 for a in n.attribute)
                for n, i in uses
            )
        ):
            continue
        rows = 0
        for node, _ in uses:
            indices = resolved(known.get(node.input[1]))
            if indices is None:
                rows = t.dims[0]  # unknown: assume it is read whole
                break
            rows += math.prod(indices)
        whole = _stored_bytes(t)
        unread += whole - min(whole, whole // t.dims[0] * rows)
    return unread


def _load(model_or_path: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    """The model, with big external tensors left on disk and small ones read in."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    path = Path(model_or_path)
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        if uses_external_data(t) and math.prod(t.dims) < SMALL_INITIALIZER:
            load_external_data_for_tensor(t, str(path.parent))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
    return model


def _stored_bytes(t: onnx.TensorProto) -> int:
    """A tensor's size as stored: element count times element size, 4-bit types packed two a byte."""
    import onnx

    count = int(math.prod(t.dims))
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    if t.data_type in _FOUR_BIT:
        return (count + 1) // 2
    if t.data_type == onnx.TensorProto.UNDEFINED:
        return 0
    return count * int(onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)


_FOUR_BIT = frozenset({21, 22, 23})  # onnx.TensorProto UINT4, INT4, FLOAT4E2M1


class _Unresolved(Exception):
    """A counted op's shape is unknown or symbolic."""


def _node_flops(node: onnx.NodeProto, known: Mapping[str, tuple[int | None, ...] | None]) -> int:
    """The node's matrix-product FLOPs (0 for any other op); raises _Unresolved."""

    def shape(index: int, outputs: bool = False) -> Shape:
        names = node.output if outputs else node.input
        found = resolved(known.get(names[index])) if index < len(names) and names[index] else None
        if found is None:
            raise _Unresolved
        return found

    def present(index: int) -> bool:
        return index < len(node.input) and bool(node.input[index])

    attrs = {a.name: a for a in node.attribute}

    def attr(name: str, default: int = 0) -> int:
        return int(attrs[name].i) if name in attrs else default

    op = node.op_type
    if op in MATMULS:
        a, b = shape(0), shape(MATMULS[op])
        if op == "FusedMatMul":
            a = a[:-2] + a[:-3:-1] if attr("transA") and len(a) > 1 else a
            b = b[:-2] + b[:-3:-1] if attr("transB") and len(b) > 1 else b
        return _matmul_flops(a, b)
    if op == "Gemm":
        a, b = shape(0), shape(1)
        rows, inner = (a[1], a[0]) if attr("transA") else a
        return 2 * rows * inner * (b[0] if attr("transB") else b[1])
    if op == "MatMulNBits":
        return 2 * math.prod(shape(0)[:-1]) * attr("K") * attr("N")
    if op in CONV_WEIGHT:
        return 2 * math.prod(shape(0, outputs=True)) * math.prod(shape(CONV_WEIGHT[op])[1:])
    if op == "Einsum":
        return _einsum_flops(node, [shape(i) for i in range(len(node.input))])
    # Attention is counted as full S_q x S_kv products even when causal: ORT's CPU kernels
    # multiply the whole blocks and mask afterwards, so this is the work done (an upper
    # bound of the work needed).
    if op == "GroupQueryAttention":
        batch, seq, hidden = shape(0)
        heads, kv_heads = attr("num_heads"), attr("kv_num_heads")
        head = hidden // (heads + 2 * kv_heads) if not present(1) else hidden // heads
        # not present_key's dim 2: ORT's symbolic inference copies the past's shape to it.
        # A past that shares its buffer with the present (max length) is counted in full.
        past = shape(3)[2] if present(3) else 0
        return 2 * batch * heads * seq * (past + seq) * head * 2
    if op == "MultiHeadAttention":
        return _mha_flops(shape, present, attr("num_heads"))
    if op == "Attention" and node.domain == "com.microsoft":
        batch, seq, hidden = shape(0)
        qkv = shape(1)[1]
        sizes = (
            [int(size) for size in attrs["qkv_hidden_sizes"].ints] if "qkv_hidden_sizes" in attrs else [qkv // 3] * 3
        )
        past = shape(4)[3] if present(4) else 0
        return 2 * batch * seq * hidden * qkv + 2 * batch * seq * (past + seq) * (sizes[0] + sizes[2])
    if op == "Attention":  # ONNX (opset 23): Q [B, heads, S, H] or [B, S, heads * H], K and V alike
        query, key, value = shape(0), shape(1), shape(2)
        q_heads, kv_heads = query[1] if len(query) == 4 else attr("q_num_heads"), attr("kv_num_heads")
        if not q_heads or (len(value) == 3 and not kv_heads):
            raise _Unresolved  # 3-D inputs take the head counts from attributes, which they require
        batch, seq, q_width = (query[0], query[2], query[1] * query[3]) if len(query) == 4 else query
        v_head = value[3] if len(value) == 4 else value[2] // kv_heads
        past = shape(4)[2] if present(4) else 0
        return 2 * batch * seq * (past + key[-2]) * (q_width + q_heads * v_head)
    return 0


def _matmul_flops(a: Shape, b: Shape) -> int:
    """numpy.matmul of shapes ``a`` and ``b``: 2 x the batch (broadcast) x M x K x N, read
    from the inputs: ORT's symbolic inference leaves the outputs of several quantized and
    fused forms (DynamicQuantizeMatMul, FusedMatMul, QLinearMatMul) unknown."""
    a = (1, *a) if len(a) == 1 else a
    b = (*b, 1) if len(b) == 1 else b
    batch = [max(x, y) for x, y in zip(_pad(a[:-2], len(b) - 2), _pad(b[:-2], len(a) - 2))]
    return 2 * math.prod(batch) * a[-2] * a[-1] * b[-1]


def _pad(dims: Shape, rank: int) -> Shape:
    """``dims`` with leading 1s up to ``rank`` (numpy's broadcasting aligns from the right)."""
    return (1,) * (rank - len(dims)) + dims


def _mha_flops(shape: Callable[[int], Shape], present: Callable[[int], bool], heads: int) -> int:
    """MultiHeadAttention: query [B, S, D] (or packed [B, S, N, 3, H]); key [B, L, D], the
    cache [B, N, L, H] or packed [B, L, N, 2, H]; past_key (input 6) [B, N, P, H]."""
    q = shape(0)
    if len(q) == 5:
        batch, seq, _, _, head = q
        return 2 * batch * seq * seq * heads * head * 2
    batch, seq, width = q
    key = shape(1)
    length = key[2] if len(key) == 4 else key[1]
    if len(key) != 4 and present(6):
        length += shape(6)[2]
    value = shape(2) if present(2) else None
    v_width = value[2] if value is not None and len(value) == 3 else width
    return 2 * batch * seq * length * (width + v_width)


def _einsum_flops(node: onnx.NodeProto, operands: list[Shape]) -> int:
    """A two-operand Einsum: 2 x the product of every index's size (one multiply-add per
    point of the joint index space). One operand is a reduction or transpose (0); three or
    more depend on the contraction order and are not counted."""
    equation = next(a.s.decode() for a in node.attribute if a.name == "equation").replace(" ", "")
    terms = equation.split("->")[0].split(",")
    if len(terms) == 1:
        return 0
    if len(terms) != 2:
        raise _Unresolved
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, dims in zip(terms, operands):
        letters = term.replace("...", "")
        if "..." in term:
            start = term.index("...")
            extra = dims[start : start + len(dims) - len(letters)]
            width = max(len(ellipsis), len(extra))
            ellipsis = [
                max(a, b)
                for a, b in zip([1] * (width - len(ellipsis)) + ellipsis, [1] * (width - len(extra)) + list(extra))
            ]
            dims = dims[:start] + dims[start + len(extra) :]
        sizes.update({c: max(sizes.get(c, 1), d) for c, d in zip(letters, dims)})
    return 2 * math.prod(sizes.values()) * math.prod(ellipsis)
