"""Work per call and the machine's limits: a roofline for the benchmark's timed rows.

A timed row says how long one call took; this module says how long it could have taken.
``graph_work`` counts the work of one call from the graph and the concrete input shapes,
``measure_peaks`` measures what this CPU reaches at its best (GEMM throughput per
precision, memory read bandwidth) and ``roofline`` puts the two beside the measured time:
the least time is ``max(flops / compute peak, weight bytes / memory bandwidth)``, and the
row achieved that fraction of it.

What is counted, and why it is enough:

- FLOPs are matrix products only (MatMul and its quantized and fused forms, Gemm,
  MatMulNBits, Conv, attention's QK^T and softmax*V, two-operand Einsum), with a
  multiply-add as 2 FLOPs. They dominate transformer and convolution work; elementwise
  ops, norms and softmax are left out.
- Bytes are the initializers as stored (4-bit weights packed, their scales and zero points
  included), read once per call; a table only Gathers read (an embedding) counts the rows
  its indices pick. That is the traffic that bounds a decode step; activations
  and the KV cache are left out, so a long-context decode reads more than this.
- An op that does heavy math but whose shapes stay unknown (or that is not modelled, such
  as QAttention or an Einsum of three operands) is named in ``Work.uncounted``: the FLOPs
  are then a lower bound.

Peaks are CPU figures: a row on another execution provider gets no roofline from them.
A row's products are all held to its precision's peak, including those it keeps in float
(an int8 model's attention): its least time then comes out a little short.

Example (all-MiniLM-L6-v2's int8 file, 128 tokens, on a 2-core AVX-512 VNNI machine):
    >>> work = graph_work("int8/model.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)})
    >>> work.flops, work.weight_bytes
    (2868903936, 22765468)
    >>> peaks = measure_peaks(threads=2)
    >>> roofline(work, time_ms=8.62, precision="int8", peaks=peaks, phase="prefill").describe()
    'int8 prefill: 40% of int8 GEMM'
"""  # noqa: E501

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    import onnx

Phase = Literal["prefill", "decode", ""]
Bound = Literal["compute", "memory"]

SMALL_INITIALIZER = 1024
"""Initializers with fewer elements keep their values for shape inference (a Reshape's
shape, a Slice's ends); bigger ones are weights, and only their dims are needed."""

GEMM_SIZES = (1024, 2048)
"""Square GEMM sizes of the compute peaks, the best one kept. One size understates them: on an
AMX core torch.mm bf16 gives 470 GFLOP/s at 1024 and 1,890 at 2048, and a benchmark row then
read "180% of bf16 GEMM"."""

INT8_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (256, 2048, 2048))
"""(M, K, N) of the int8 peak: square ones and a prefill's (few rows, wide weights)."""

LOADED_BELOW = 0.8
"""A measurement got less than this share of its threads' CPU time (process CPU time over
wall time x threads): something else ran on the cores, so its figures are low."""

MEMORY_BYTES = 512 * 2**20
"""The read-bandwidth buffer: beyond all but the largest L3 caches, within the memory a build step may use."""

INT8_PRECISIONS = frozenset({"int8", "uint8", "int4", "uint4"})
"""Row precisions whose products run in int8: int4 means MatMulNBits, which multiplies in
int8 at accuracy_level 4 (the quantize step's default)."""


class WorkDict(TypedDict):
    flops: int
    weight_bytes: int
    by_op: dict[str, int]
    uncounted: list[str]


class PeaksDict(TypedDict):
    fp32_gflops: float
    bf16_gflops: float | None
    int8_gops: float | None
    memory_gbps: float
    threads: int
    how: dict[str, str]
    cpu_share: float | None


class RooflineDict(TypedDict):
    gflops: float
    gbps: float
    bound: Bound
    limit: str
    fraction: float
    min_ms: float


@dataclass(frozen=True)
class Work:
    """What one call of a graph does: its matrix-product FLOPs and the weight bytes it reads."""

    flops: int
    weight_bytes: int
    by_op: dict[str, int] = field(default_factory=dict, hash=False)
    """FLOPs per op type (only op types that did some)."""
    uncounted: tuple[str, ...] = ()
    """Op types with heavy math left out (shapes unknown or not modelled): ``flops`` is then a lower bound."""

    def as_dict(self) -> WorkDict:
        return {
            "flops": self.flops,
            "weight_bytes": self.weight_bytes,
            "by_op": dict(self.by_op),
            "uncounted": list(self.uncounted),
        }


@dataclass(frozen=True)
class Peaks:
    """The best this CPU reached with ``threads`` threads; None where it has no native support."""

    fp32_gflops: float
    bf16_gflops: float | None
    int8_gops: float | None
    memory_gbps: float
    threads: int
    how: dict[str, str] = field(default_factory=dict, hash=False)
    """One line per figure on how it was measured (or why it was not)."""
    cpu_share: float | None = None
    """The share of its threads' CPU time the timed calls got (None: not known); below
    :data:`LOADED_BELOW` the machine was loaded and the figures are low."""

    @property
    def loaded(self) -> bool:
        return self.cpu_share is not None and self.cpu_share < LOADED_BELOW

    def as_dict(self) -> PeaksDict:
        return {
            "fp32_gflops": self.fp32_gflops,
            "bf16_gflops": self.bf16_gflops,
            "int8_gops": self.int8_gops,
            "memory_gbps": self.memory_gbps,
            "threads": self.threads,
            "how": dict(self.how),
            "cpu_share": self.cpu_share,
        }

    def at_least(self, other: Peaks) -> Peaks:
        """Each figure the higher of the two (a peak is a best case), with the lines saying how."""

        def best(key: str, a: float | None, b: float | None) -> float | None:
            if a is None or (b is not None and b > a):
                how[key] = other.how.get(key, how.get(key, ""))
                return b
            return a

        how = dict(self.how)
        fp32 = best("fp32_gflops", self.fp32_gflops, other.fp32_gflops)
        memory = best("memory_gbps", self.memory_gbps, other.memory_gbps)
        assert fp32 is not None and memory is not None
        bf16 = best("bf16_gflops", self.bf16_gflops, other.bf16_gflops)
        int8 = best("int8_gops", self.int8_gops, other.int8_gops)
        shares = [s for s in (self.cpu_share, other.cpu_share) if s is not None]
        return Peaks(fp32, bf16, int8, memory, self.threads, how, min(shares) if shares else None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Peaks:
        """The inverse of ``as_dict``; raises ValueError naming the first bad key."""

        def number(key: str, optional: bool = False) -> float | None:
            value = data.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"peaks.{key}: must be a positive number{' or null' if optional else ''} (got {value!r})"
                )
            return float(value)

        threads = data.get("threads")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"peaks.threads: must be a positive integer (got {threads!r})")
        how = data.get("how", {})
        if not isinstance(how, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in how.items()):
            raise ValueError(f"peaks.how: must map figure names to strings (got {how!r})")
        fp32, memory = number("fp32_gflops"), number("memory_gbps")
        assert fp32 is not None and memory is not None
        return cls(
            fp32,
            number("bf16_gflops", True),
            number("int8_gops", True),
            memory,
            threads,
            dict(how),
            number("cpu_share", True),
        )


@dataclass(frozen=True)
class Roofline:
    """One timed row against the machine's limits."""

    gflops: float
    """Achieved matrix-product GFLOP/s (GOP/s for int8)."""
    gbps: float
    """Achieved weight read rate, GB/s."""
    bound: Bound
    """Which limit the row's least time comes from."""
    limit: str
    """The peak that bounds it: "fp32 GEMM", "bf16 GEMM", "int8 GEMM" or "memory bandwidth"."""
    fraction: float
    """Least time over measured time: 1.0 is at the limit (above 1 when peaks were measured low)."""
    min_ms: float
    """The least time one call could take at the peaks."""
    precision: str = ""
    phase: Phase = ""
    uncounted: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for a report, such as ``int4 decode: 31% of memory bandwidth``."""
        label = " ".join(p for p in (self.precision, self.phase) if p)
        text = f"{label + ': ' if label else ''}{self.fraction:.0%} of {self.limit}"
        return text + (f" (at least: {', '.join(self.uncounted)} not counted)" if self.uncounted else "")

    def as_dict(self) -> RooflineDict:
        return {
            "gflops": self.gflops,
            "gbps": self.gbps,
            "bound": self.bound,
            "limit": self.limit,
            "fraction": self.fraction,
            "min_ms": self.min_ms,
        }


# -- work ---------------------------------------------------------------------------------

Shape = tuple[int, ...]
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
    light = _light_copy(model, shapes)
    if light.functions:
        light = onnx.inliner.inline_local_functions(light)
    known = _infer_shapes(light)
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
            indices = _resolved(known.get(node.input[1]))
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


def _light_copy(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy for shape inference, the graph inputs fixed to ``shapes``. Small initializers
    are copied; big ones become graph inputs of their type and shape, so the weights are
    not copied (a 500 MB model costs no second 500 MB): shape inference needs only their
    dims."""
    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    # A big initializer becomes an input of its type and shape rather than an initializer
    # without its data: ORT's inference reads the values of any initializer an Add or Mul
    # takes, and fails on one whose data is missing.
    for t in model.graph.initializer:
        if math.prod(t.dims) < SMALL_INITIALIZER and t.data_location != onnx.TensorProto.EXTERNAL:
            graph.initializer.add().CopyFrom(t)
        else:
            graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))

    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - initializers
    unknown = sorted(set(shapes) - inputs)
    if unknown:
        raise ValueError(
            f"shapes: {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} "
            f"not an input of the graph (inputs: {', '.join(sorted(inputs)) or 'none'})"
        )
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        added = graph.input.add()
        added.CopyFrom(vi)
        if vi.name not in shapes:
            continue
        want = tuple(int(d) for d in shapes[vi.name])
        declared = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        if declared is not None:
            if len(declared) != len(want):
                raise ValueError(f"shapes[{vi.name!r}]: the input has rank {len(declared)}, got {want}")
            fixed = [
                (i, d.dim_value) for i, d in enumerate(declared) if d.HasField("dim_value") and d.dim_value != want[i]
            ]
            if fixed:
                i, value = fixed[0]
                raise ValueError(f"shapes[{vi.name!r}]: dimension {i} of the input is fixed at {value}, got {want}")
        shape = added.type.tensor_type.shape
        shape.Clear()
        for d in want:
            shape.dim.add().dim_value = d
    return light


def _infer_shapes(light: onnx.ModelProto) -> dict[str, tuple[int | None, ...] | None]:
    """Every tensor's shape after inference: a dim is None where it stayed symbolic.

    ONNX Runtime's symbolic inference knows the contrib ops (GroupQueryAttention,
    MatMulNBits, SkipLayerNormalization, ...). Its public ``infer_shapes`` is not used: it
    raises when anything is left unknown and then saves the model into the working
    directory (sym_shape_infer_temp.onnx). Its loop is run here instead, keeping whatever
    it resolved; it stops at the first op it cannot infer, so ONNX's own inference
    (``data_prop``) fills in what it left, and stands in entirely if it fails.
    """
    import onnx

    found: dict[str, tuple[int | None, ...] | None] = {}
    complete = False
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        symbolic = SymbolicShapeInference(int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
        contrib = symbolic.dispatcher_.get("Attention")
        if contrib is not None:
            # it takes every Attention for the contrib op: ONNX's own (opset 23) is inferred by ONNX
            symbolic.dispatcher_["Attention"] = lambda node: (
                _onnx_attention(symbolic, node) if node.domain in ("", "ai.onnx") else contrib(node)
            )
        symbolic._preprocess(light)
        while symbolic.run_:
            complete = symbolic._infer_impl()
        symbolic._update_output_from_vi()
        found = _shapes_of(symbolic.out_mp_.graph)
    except Exception:  # internals that change between ORT versions or trip on a graph: use ONNX's inference
        complete = False
    if not complete:
        try:
            fallback = _shapes_of(onnx.shape_inference.infer_shapes(light, data_prop=True).graph)
        except Exception:
            fallback = _shapes_of(light.graph)
        for name, shape in fallback.items():
            if _resolved(found.get(name)) is None:
                found[name] = shape
    return found


def _onnx_attention(symbolic: Any, node: onnx.NodeProto) -> None:
    """ONNX's Attention (opset 23) through ONNX's inference, the node alone with its inputs'
    known shapes; the outputs' shapes go where ORT's symbolic inference keeps them."""
    import onnx
    from onnx import helper

    inputs = [symbolic.known_vi_[name] for name in node.input if name]
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    alone = helper.make_model(
        helper.make_graph([node], "attention", inputs, outputs), opset_imports=[helper.make_opsetid("", 23)]
    )
    for vi in onnx.shape_inference.infer_shapes(alone, strict_mode=False).graph.output:
        if vi.type.tensor_type.HasField("shape"):
            symbolic.known_vi_[vi.name].CopyFrom(vi)


def _shapes_of(graph: onnx.GraphProto) -> dict[str, tuple[int | None, ...] | None]:
    out: dict[str, tuple[int | None, ...] | None] = {}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        t = vi.type.tensor_type
        out[vi.name] = (
            tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
            if t.HasField("shape")
            else None
        )
    return out


def _resolved(shape: tuple[int | None, ...] | None) -> Shape | None:
    if shape is None or any(d is None for d in shape):
        return None
    return tuple(d for d in shape if d is not None)


class _Unresolved(Exception):
    """A counted op's shape is unknown or symbolic."""


def _node_flops(node: onnx.NodeProto, known: Mapping[str, tuple[int | None, ...] | None]) -> int:
    """The node's matrix-product FLOPs (0 for any other op); raises _Unresolved."""

    def shape(index: int, outputs: bool = False) -> Shape:
        names = node.output if outputs else node.input
        found = _resolved(known.get(names[index])) if index < len(names) and names[index] else None
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


# -- peaks --------------------------------------------------------------------------------


def measure_peaks(threads: int, budget_s: float = 1.0) -> Peaks:
    """Measure this CPU's best GEMM throughput per precision and its memory read bandwidth.

    Each figure is the best over the sizes in :data:`GEMM_SIZES` (int8: :data:`INT8_SHAPES`)
    and, for fp32, over two libraries (torch's BLAS and onnxruntime's MLAS: on some CPUs one
    is twice the other), each the best of as many repeats as fit in ``budget_s`` (after a
    warm-up call): a peak is a best case. bf16 and int8 are measured only where the CPU has
    native instructions for them (``BF16_FLAGS``, ``INT8_FLAGS``) and are None elsewhere:
    emulated, they would be no limit anyone reaches for. ``cpu_share`` says how much of its
    threads' CPU time the timed calls got: a loaded machine gives low figures
    (:attr:`Peaks.loaded`). About ``10 * budget_s`` seconds plus imports and the calls
    themselves, and a 512 MiB buffer.

    Args:
        threads: the threads each benchmark uses (set for torch, and as onnxruntime's
            intra-op threads), as the timed rows do.
        budget_s: the time spent repeating each figure at each size.
    """
    import torch

    from onnxbuild.environment import BF16_FLAGS, INT8_FLAGS, cpu_info

    flags = set(cpu_info()[1].split())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    how: dict[str, str] = {}
    clock = _Clock()
    try:
        fp32, how["fp32_gflops"] = max(
            [_torch_gemm(torch.float32, n, threads, budget_s, clock) for n in GEMM_SIZES]
            + [_ort_gemm(n, threads, budget_s, clock) for n in GEMM_SIZES]
        )
        bf16: float | None = None
        if flags & set(BF16_FLAGS):
            bf16, how["bf16_gflops"] = max(_torch_gemm(torch.bfloat16, n, threads, budget_s, clock) for n in GEMM_SIZES)
        else:
            how["bf16_gflops"] = f"not measured: no native bf16 on this CPU (flags {', '.join(sorted(BF16_FLAGS))})"
        int8: float | None = None
        if flags & set(INT8_FLAGS):
            int8, how["int8_gops"] = max(_ort_int8_gemm(shape, threads, budget_s, clock) for shape in INT8_SHAPES)
        else:
            how["int8_gops"] = (
                f"not measured: no int8 dot-product instructions on this CPU (flags {', '.join(sorted(INT8_FLAGS))})"
            )
        memory, how["memory_gbps"] = _read_bandwidth(threads, budget_s, clock)
    finally:
        torch.set_num_threads(before)
    share = clock.share(threads)
    return Peaks(
        _sig(fp32),
        None if bf16 is None else _sig(bf16),
        None if int8 is None else _sig(int8),
        _sig(memory),
        threads,
        how,
        round(share, 3),
    )


class _Clock:
    """Wall time and this process's CPU time (all its threads) over the timed calls."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def share(self, threads: int) -> float:
        return min(1.0, self.cpu / (self.wall * threads)) if self.wall > 0 else 1.0


def cpu_share(threads: int, seconds: float = 0.3) -> float:
    """The share of ``threads`` threads' CPU time a short onnxruntime GEMM loop (384^2, the
    peaks' fp32 kernel) gets now: about 1 on an idle machine, about 0.5 where another job keeps
    every core busy."""
    clock = _Clock()
    _ort_gemm(384, threads, seconds, clock)
    return round(clock.share(threads), 3)


def _best(
    call: Callable[[], object], budget_s: float, warmup: int = 1, clock: _Clock | None = None
) -> tuple[float, int]:
    """The shortest time of ``call`` (seconds) over at least 3 repeats and ``budget_s``, and the repeat count."""
    for _ in range(warmup):
        call()
    best, count = math.inf, 0
    end = time.perf_counter() + budget_s
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while count < 3 or time.perf_counter() < end:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        count += 1
    if clock is not None:
        clock.cpu += time.process_time() - cpu0
        clock.wall += time.perf_counter() - wall0
    return best, count


def _torch_gemm(dtype: Any, n: int, threads: int, budget_s: float, clock: _Clock | None = None) -> tuple[float, str]:
    import torch

    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    with torch.inference_mode():
        seconds, count = _best(lambda: torch.mm(a, b, out=out), budget_s, clock=clock)
    name = str(dtype).removeprefix("torch.")
    return (
        2 * n**3 / seconds / 1e9,
        f"torch.mm {n}x{n} {name}, {threads} thread(s), best of {count}: 2n^3 / time "
        f"(best of sizes {', '.join(map(str, GEMM_SIZES))})",
    )


def _session(nodes: Any, inputs: Any, outputs: Any, weights: Any, threads: int) -> Any:
    import onnx
    import onnxruntime as ort

    graph = onnx.helper.make_graph(nodes, "peak", inputs, outputs, weights)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ort_gemm(n: int, threads: int, budget_s: float, clock: _Clock | None = None) -> tuple[float, str]:
    """onnxruntime's fp32 MatMul (MLAS, as every fp32 ONNX row runs it)."""
    import numpy as np
    import onnx

    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((n, n), dtype=np.float32), "B")
    session = _session(
        [onnx.helper.make_node("MatMul", ["A", "B"], ["Y"])],
        [onnx.helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [n, n])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [n, n])], [weight], threads,
    )  # fmt: skip
    feeds = {"A": rng.standard_normal((n, n), dtype=np.float32)}
    seconds, count = _best(lambda: session.run(None, feeds), budget_s, clock=clock)
    return (
        2 * n**3 / seconds / 1e9,
        f"onnxruntime MatMul float32 {n}x{n}, {threads} intra-op thread(s), best of {count}: 2n^3 / time "
        f"(best of torch and onnxruntime at sizes {', '.join(map(str, GEMM_SIZES))})",
    )


def _ort_int8_gemm(
    shape: tuple[int, int, int], threads: int, budget_s: float, clock: _Clock | None = None
) -> tuple[float, str]:
    """onnxruntime's int8 GEMM (MLAS, as dynamic quantization's MatMulInteger runs it): u8 x s8."""
    import numpy as np
    import onnx

    m, k, n = shape
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.integers(-128, 128, (k, n), dtype=np.int8), "B")
    session = _session(
        [onnx.helper.make_node("MatMulInteger", ["A", "B"], ["Y"])],
        [onnx.helper.make_tensor_value_info("A", onnx.TensorProto.UINT8, [m, k])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.INT32, [m, n])], [weight], threads,
    )  # fmt: skip
    feeds = {"A": rng.integers(0, 256, (m, k), dtype=np.uint8)}
    seconds, count = _best(lambda: session.run(None, feeds), budget_s, clock=clock)
    return (
        2 * m * k * n / seconds / 1e9,
        f"onnxruntime MatMulInteger uint8 {m}x{k} x int8 {k}x{n}, {threads} intra-op thread(s), best of {count}: "
        f"2mkn / time (best of {', '.join(f'{a}x{b}x{c}' for a, b, c in INT8_SHAPES)})",
    )


def _read_bandwidth(threads: int, budget_s: float, clock: _Clock | None = None) -> tuple[float, str]:
    import torch

    buffer = torch.ones(MEMORY_BYTES // 4, dtype=torch.float32)
    with torch.inference_mode():
        seconds, count = _best(buffer.sum, budget_s, clock=clock)
    return (
        MEMORY_BYTES / seconds / 1e9,
        f"torch sum of a {MEMORY_BYTES // 2**20} MiB float32 tensor, {threads} thread(s), best of {count}: "
        "bytes / time",
    )


def _sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: figures for a report, not for arithmetic."""
    return float(f"{value:.{digits}g}")


# -- roofline -----------------------------------------------------------------------------


def roofline(work: Work, time_ms: float, precision: str, peaks: Peaks, phase: Phase = "") -> Roofline:
    """A timed row against the machine's limits.

    The compute peak follows the row's precision: bf16 uses the bf16 GEMM peak, int8, uint8
    and int4 the int8 one (each falling back to fp32 where the CPU has none), everything
    else fp32 (fp16 on the CPU computes in fp32). The least time is
    ``max(flops / compute peak, weight_bytes / memory bandwidth)``; ``fraction`` is it over
    ``time_ms``, not clamped: above 1 means the peaks were measured low.

    Raises:
        ValueError: ``time_ms`` or a peak used is not positive.
    """
    if not time_ms > 0:
        raise ValueError(f"time_ms: must be positive (got {time_ms!r})")
    compute_name, compute_peak = "fp32 GEMM", peaks.fp32_gflops
    if precision == "bf16" and peaks.bf16_gflops is not None:
        compute_name, compute_peak = "bf16 GEMM", peaks.bf16_gflops
    elif precision in INT8_PRECISIONS and peaks.int8_gops is not None:
        compute_name, compute_peak = "int8 GEMM", peaks.int8_gops
    if not compute_peak > 0 or not peaks.memory_gbps > 0:
        raise ValueError(
            f"peaks: {compute_name} and memory bandwidth must be positive (got {compute_peak!r}, {peaks.memory_gbps!r})"
        )
    seconds = time_ms / 1e3
    compute_s = work.flops / (compute_peak * 1e9)
    memory_s = work.weight_bytes / (peaks.memory_gbps * 1e9)
    bound: Bound = "compute" if compute_s >= memory_s and compute_s > 0 else "memory"
    least = max(compute_s, memory_s)
    return Roofline(
        gflops=_sig(work.flops / seconds / 1e9),
        gbps=_sig(work.weight_bytes / seconds / 1e9),
        bound=bound,
        limit=compute_name if bound == "compute" else "memory bandwidth",
        fraction=round(least / seconds, 3),
        min_ms=_sig(least * 1e3),
        precision=precision,
        phase=phase,
        uncounted=work.uncounted,
    )
