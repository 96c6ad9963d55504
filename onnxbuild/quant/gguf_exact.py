"""A GGUF file's own quantized blocks carried into the fused decoder graph, not re-quantized.

A GGUF checkpoint is already quantized; loading it with transformers dequantizes it to float32,
and quantizing that graph again (``quantize.int4``) rounds a second time, onto a different grid,
so the result is neither the GGUF model nor the float one. The legacy ggml block types map onto
ONNX Runtime's contrib ops without any rounding: block size 32 along the input axis, one fp16
scale per block (exactly a float32), and integer codes:

- ``Q4_0`` (``x = d * (q - 8)``): 4-bit ``MatMulNBits``, default zero point 8.
- ``Q8_0`` (``x = d * q``, q int8): 8-bit ``MatMulNBits``, codes ``q + 128``, default zero
  point 128, at ``accuracy_level`` 4 (below it ONNX Runtime 1.31's CPU kernel has no prepacked
  8-bit path, so the weight stays float unless ``slow_8bit``); ``GatherBlockQuantized`` with
  ``bits=8`` for the embedding.
- ``Q4_1`` (``x = d * q + m``): where every block of a tensor has ``m == -z * d`` for a whole z
  in 0..15, 4-bit with packed uint8 zero points z. Otherwise (nearly always: 0.3% of SmolLM2's
  blocks qualify) one of two forms, ``q4_1=``:

  - ``split`` (default): 4-bit ``MatMulNBits`` with the nearest whole zero points z, plus what
    is left, ``r = m + z * d`` (|r| <= d / 2), as a float MatMul on the activation's block sums
    (``sum_k a_k * r_block(k)``, a [K/32, N] weight) and an Add. The weight is ggml's bit for
    bit; ONNX Runtime's fast prepacked (and, at ``accuracy_level`` 4, int8) kernels run the
    codes.
  - ``float``: float zero points ``-m / d``, ``(q - zp) * d``: one op, but ggml's values only to
    an ulp (the rounding of ``-m / d``), and ONNX Runtime 1.31's CPU kernel has no prepacked
    path for float zero points: it dequantizes the whole weight on every call (measured 1.4 to
    1.9 ms against 25 to 110 us for one token through a 576 x 1536 weight).

Anything else (F32, F16, BF16, Q5_*, the K-quants, the IQ types) is not carried: it is named in
the returned list and its weight stays float, for the caller to keep or re-quantize.

SmolLM2-135M-Instruct.Q4_1.gguf (210 Q4_1 linears, tied Q8_0 embedding) through the fused
decoder, one thread of a shared 2-core EPYC: 654 MB float -> 148 MB (229 MB at accuracy_level 0,
lm_head float); logits within 1.6e-4 of the float graph at accuracy_level 0; one token after 128,
30 ms float, 21 ms split at level 0, 12 ms split at level 4, 181 ms with float zero points.

GGUF stores each output row's K values contiguously in blocks (``ne = [K, N]``), which is
``MatMulNBits``'s ``[N, k_blocks, blob]`` already, up to the nibble order (ggml puts value j and
j + 16 in one byte, ``MatMulNBits`` values 2i and 2i + 1). llama.cpp permutes the rows of
``attn_q`` and ``attn_k`` for its rotary layout; transformers reverses that on load. A row
permutation keeps blocks whole, so the same permutation applies to codes, scales and zero points
of those rows; it is taken from transformers' own tensor processor (run on row numbers), and the
GGUF-to-Hugging-Face names from gguf's tensor name map, as transformers' loader does.

One module (~790 lines): the block layouts, the nibble order, the row permutation and the two
Q4_1 forms are one claim, that the graph computes the GGUF's own weights bit for bit, and
tests/test_gguf_exact.py proves them together against gguf's own dequantizer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, SupportsIndex, SupportsInt

from onnxbuild.fusion.passes import Pass, drop_unused, replace_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from gguf import GGUFReader, ReaderTensor, TensorNameMap
    from numpy.typing import NDArray

    U8 = NDArray[np.uint8]
    F32 = NDArray[np.float32]

MS = "com.microsoft"
BLOCK = 32
"""ggml's block size for every type carried here (QK4_0 = QK4_1 = QK8_0 = 32)."""

CARRIED = ("Q4_0", "Q4_1", "Q8_0")

# Hugging Face module (within a layer) -> GGUF tensor, for when gguf's own name map does not know
# the file's architecture: llama.cpp's names for the Llama family
_LLAMA = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP = {"model.embed_tokens": "token_embd", "lm_head": "output"}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Carried:
    """One GGUF tensor's place in the rewritten graph, or why it has none.

    A packed ONNX weight (``qkv_proj``: q, k and v) has one entry per GGUF tensor in it, and is
    carried only when all of them are; a tied embedding table has two (``lm_head.weight`` and
    ``model.embed_tokens.weight``). ``exact`` is True when the graph holds the GGUF's own codes,
    scales and offsets; ``max_error`` is then the largest difference between the weight the new
    ops stand for and the graph's float weight they replaced (0 but for ``float`` zero points,
    where it is an ulp or so)."""

    gguf_name: str
    gguf_type: str
    onnx_name: str
    op: str = ""
    """``MatMulNBits`` or ``GatherBlockQuantized``; empty where the weight stayed float."""
    bits: int = 0
    block_size: int = 0
    zero_points: str = ""
    """``default`` (none stored: 2^(bits-1)), ``uint8``, ``float``, or ``uint8+offsets`` (Q4_1
    split: zero points 0 and a float MatMul on the block sums); empty where not carried."""
    exact: bool = False
    why_not: str = ""
    max_error: float = 0.0


@dataclass(frozen=True)
class Blocks:
    """One ONNX weight's blocks, in ``MatMulNBits``'s order, before packing.

    ``codes`` (uint8 [N, k_blocks, 32], one code per byte), ``scales`` (float32 [N, k_blocks]),
    ``zero_points`` (None for the default 2^(bits-1), else uint8 or float32 [N, k_blocks]) and
    ``offsets`` (None, or float32 [N, k_blocks]: Q4_1's m): the weight is
    ``(codes - zero_points) * scales + offsets``, transposed. ``raw`` keeps the GGUF rows that
    went in (after the row order), so :meth:`reference` can dequantize them as ggml does."""

    sources: tuple[tuple[str, str], ...]
    """(GGUF name, ggml type) of each tensor in it, in output order."""
    bits: int
    codes: U8
    scales: F32
    zero_points: U8 | F32 | None
    offsets: F32 | None
    raw: tuple[tuple[str, U8], ...] = field(repr=False)

    @property
    def n(self) -> int:
        return int(self.codes.shape[0])

    @property
    def k(self) -> int:
        return int(self.codes.shape[1]) * BLOCK

    @property
    def zero_point_kind(self) -> str:
        if self.offsets is not None:
            return "uint8+offsets"
        if self.zero_points is None:
            return "default"
        return "float" if self.zero_points.dtype.kind == "f" else "uint8"

    def packed(self) -> U8:
        """``MatMulNBits``'s B, uint8 [N, k_blocks, 32 * bits / 8]: value 2i in the low nibble
        of byte i, 2i + 1 in the high one (4-bit); one byte a value (8-bit)."""
        import numpy as np

        if self.bits == 8:
            return np.ascontiguousarray(self.codes)
        return np.ascontiguousarray(self.codes[..., 0::2] | (self.codes[..., 1::2] << 4)).astype(np.uint8)

    def packed_zero_points(self) -> U8 | F32 | None:
        """Zero points as ``MatMulNBits`` takes them: uint8 [N, ceil(k_blocks * bits / 8)]
        packed like B, or float32 [N, k_blocks]; None for the default."""
        z = self.zero_points
        if z is None or z.dtype.kind == "f" or self.bits == 8:
            return z
        return pack_zero_points(z, self.bits)

    def dequantize(self) -> F32:
        """The weight the ops stand for, float32 [K, N]: ``(q - zp) * scale (+ offset)``, each
        step rounded to float32 as ONNX Runtime (and, for Q4_1's ``d * q + m``, ggml) rounds."""
        import numpy as np

        zp = (
            np.float32(2 ** (self.bits - 1))
            if self.zero_points is None
            else self.zero_points.astype(np.float32)[..., None]
        )
        w: F32 = (self.codes.astype(np.float32) - zp) * self.scales[..., None]
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        out: F32 = w.reshape(self.n, self.k).T  # numpy's stubs give .T no type on Python 3.10
        return out

    def reference(self) -> NDArray[np.generic]:
        """The weight as ggml (and transformers' loader) dequantizes the same GGUF rows, float32
        [K, N]: what :meth:`dequantize` must reproduce."""
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        rows = [dequantize(r, GGMLQuantizationType[kind]) for kind, r in self.raw]
        out: NDArray[np.generic] = np.concatenate(rows, axis=0).T
        return out

    def with_float_zero_points(self) -> Blocks:
        """The same weight with the offsets folded into float zero points, ``zp - m / d`` (a
        block of ``d == 0``, m throughout, becomes codes 1, scale m, zero point 0): exact up to
        the rounding of ``m / d``. 4-bit only: ONNX Runtime's CPU ``MatMulNBits`` has no 8-bit
        kernel with float zero points."""
        import numpy as np

        if self.offsets is None:
            return self
        if self.bits != 4:
            raise _NotCarried(
                "8-bit blocks with Q4_1 offsets (a packed weight of Q4_1 and Q8_0 parts): "
                "ONNX Runtime's CPU MatMulNBits has no 8-bit kernel with float zero points"
            )
        z = (
            np.full(self.scales.shape, 2 ** (self.bits - 1), np.float32)
            if self.zero_points is None
            else self.zero_points.astype(np.float32)
        )
        zero = self.scales == 0
        codes = self.codes.copy()
        codes[zero] = 1
        scales = np.where(zero, self.offsets, self.scales).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.where(zero, np.float32(0), z - self.offsets / np.where(zero, np.float32(1), self.scales)).astype(
                np.float32
            )
        return replace(self, codes=codes, scales=scales, zero_points=zp, offsets=None)


@dataclass(frozen=True)
class Mapped:
    """What one ONNX weight is made of in the GGUF: its blocks, or why they cannot be carried."""

    onnx_name: str
    sources: tuple[tuple[str, str], ...]
    blocks: Blocks | None
    why_not: str = ""


class _NotCarried(Exception):
    """A weight that has no exact form here; the message says why."""


def read(gguf_path: Path, onnx_names: Sequence[str], *, outputs: Mapping[str, int] | None = None) -> dict[str, Mapped]:
    """The GGUF blocks behind each of ``onnx_names`` (the fused decoder's float weight names),
    mapped, row-permuted and concatenated as transformers would load them into the model the
    graph was written from. ``outputs`` (a weight's output count N, where known) lets a gate or
    up projection come from half of a packed ``ffn_up`` (Phi-3), which only the sizes tell."""
    from gguf import GGUFReader

    return _read(GGUFReader(gguf_path), onnx_names, outputs or {})


PASS = Pass(
    "gguf-carry",
    requires="float MatMuls whose weights a GGUF file holds in a block layout MatMulNBits takes (Q4_0, Q4_1, Q8_0...)",
    guarantees="each such MatMul is a MatMulNBits (float zero points split into codes and block sums) holding the "
    "GGUF's own blocks, bit for bit; the float weights it replaced are gone",
)


def carry(
    model: onnx.ModelProto,
    gguf_path: Path,
    *,
    accuracy_level: int,
    embedding: bool = True,
    q4_1: Literal["split", "float"] = "split",
    slow_8bit: bool = False,
    check: bool = True,
    tolerance: float = 1e-5,
) -> tuple[onnx.ModelProto, list[Carried]]:
    """``model`` (a fused decoder, see onnxbuild/fusion/decoder.py) with each MatMul whose float
    weight the GGUF holds in a carried type rewritten as ``MatMulNBits``, and the embedding
    Gather as ``GatherBlockQuantized`` (``embedding``), in place; replaced float weights that
    nothing else reads are removed. Returns the model and one :class:`Carried` per GGUF tensor
    met (or per MatMul/Gather weight with no GGUF tensor behind it).

    ``q4_1`` picks the form of Q4_1 offsets that are not whole zero points (module docstring:
    ``split`` keeps ONNX Runtime's fast kernels, ``float`` loses them). ``check`` compares the
    weight the new ops stand for with the float weight they replace and keeps the float weight
    where they differ by more than ``tolerance`` x its largest magnitude: a graph written from
    other weights than this GGUF's (the original checkpoint, say) or a layout this module does
    not know stays as it was instead of changing silently. ``accuracy_level`` goes to every
    ``MatMulNBits`` (4: int8 compute of the activations, where the kernel has it). Below 4, an
    8-bit weight (Q8_0, or a packed weight with a Q8_0 part) stays float unless ``slow_8bit``:
    ONNX Runtime 1.31's CPU kernel has no prepacked 8-bit path there and dequantizes the whole
    weight on every call (SmolLM2's lm_head at one token: 178 ms, against 9.5 ms in float and
    1.7 ms at accuracy_level 4); the float weight is the exact dequantized one anyway."""
    import numpy as np
    from gguf import GGUFReader
    from onnx import helper, numpy_helper

    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ValueError(f"accuracy_level must be 0..4, not {accuracy_level!r}")
    if q4_1 not in ("split", "float"):
        raise ValueError(f"q4_1 must be 'split' or 'float', not {q4_1!r}")
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}

    def float_2d(name: str) -> bool:
        t = inits.get(name)
        return t is not None and len(t.dims) == 2 and t.data_type == 1  # FLOAT

    targets: list[tuple[int, onnx.NodeProto, str]] = []  # (position, node, its float weight)
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "MatMul" and len(node.input) == 2 and float_2d(node.input[1]):
            targets.append((i, node, node.input[1]))
        elif embedding and node.op_type == "Gather" and float_2d(node.input[0]) and _attr(node, "axis", 0) == 0:
            targets.append((i, node, node.input[0]))
    outputs = {w: int(inits[w].dims[1] if n.op_type == "MatMul" else inits[w].dims[0]) for _, n, w in targets}
    mapped = _read(GGUFReader(gguf_path), sorted(outputs), outputs)

    made: dict[tuple[str, str], list[str]] = {}  # (weight, op) -> its new initializers
    sums: BlockSums = {}
    rewritten: dict[int, list[onnx.NodeProto]] = {}  # position -> the nodes in its place
    carried: list[Carried] = []
    replaced: set[str] = set()
    for position, node, weight in targets:
        m = mapped[weight]
        op = "MatMulNBits" if node.op_type == "MatMul" else "GatherBlockQuantized"
        b = m.blocks
        try:
            if b is None:
                raise _NotCarried(m.why_not)
            if op == "GatherBlockQuantized" and b.offsets is not None:
                raise _NotCarried(
                    "GatherBlockQuantized has neither float zero points nor offsets, "
                    "and these Q4_1 offsets are not whole multiples of the scale"
                )
            if q4_1 == "float":
                b = b.with_float_zero_points()
            if op == "MatMulNBits" and b.bits == 8 and accuracy_level < 4 and not slow_8bit:
                raise _NotCarried(
                    f"8-bit at accuracy_level {accuracy_level}: ONNX Runtime's CPU MatMulNBits has no prepacked 8-bit "
                    "kernel below accuracy_level 4 and would dequantize the whole weight on every call; kept float "
                    "(the exact dequantized weight), pass slow_8bit=True to carry it anyway"
                )
            w = numpy_helper.to_array(inits[weight])
            want = (b.k, b.n) if op == "MatMulNBits" else (b.n, b.k)
            if tuple(w.shape) != want:
                raise _NotCarried(
                    f"the GGUF's {' + '.join(s for s, _ in b.sources)} give a [{want[0]}, {want[1]}] weight; "
                    f"the graph's {weight} is {list(w.shape)}"
                )
            error = 0.0
            if check and w.size:
                deq = b.dequantize() if op == "MatMulNBits" else b.dequantize().T
                error = float(np.max(np.abs(deq - w)))
                scale = float(np.max(np.abs(w)))
                if not error <= tolerance * scale:
                    raise _NotCarried(
                        f"dequantized, the GGUF's blocks differ from the graph's {weight} by up to {error:.3g} "
                        f"({error / max(scale, 1e-30):.3g} of its largest value): the graph was not written from this "
                        "GGUF, or from a layout this module does not know"
                    )
        except _NotCarried as e:
            sources = m.sources or (("", ""),)
            carried += [Carried(name, kind, weight, exact=False, why_not=str(e)) for name, kind in sources]
            continue

        key = (weight, op)
        if key not in made:
            made[key] = _initializers(graph, weight, b, op)
        data, scales, *rest = made[key]
        prefix = node.name or node.output[0]
        if op == "GatherBlockQuantized":
            # make_node's own **kwargs: Any (an attribute may be any of ONNX's attribute types)
            attrs: dict[str, Any] = {"bits": b.bits, "block_size": BLOCK, "gather_axis": 0, "quantize_axis": 1}
            rewritten[position] = [
                helper.make_node(
                    op,
                    [data, node.input[1], scales, *rest],
                    list(node.output),
                    name=f"{prefix}_Q{b.bits}",
                    domain=MS,
                    **attrs,
                )
            ]
        else:
            attrs = {
                "K": b.k,
                "N": b.n,
                "bits": b.bits,
                "block_size": BLOCK,
                **({"accuracy_level": accuracy_level} if accuracy_level else {}),
            }
            offsets = rest.pop() if b.offsets is not None else None
            rewritten[position] = split_matmul_nbits(
                graph,
                sums,
                activation=node.input[0],
                output=node.output[0],
                prefix=prefix,
                name=f"{prefix}_Q{b.bits}",
                weights=[data, scales, *rest],
                offsets=offsets,
                attributes=attrs,
            )
        replaced.add(weight)
        carried += [
            Carried(name, kind, weight, op, b.bits, BLOCK, b.zero_point_kind, True, "", error)
            for name, kind in b.sources
        ]

    if rewritten:
        replace_nodes(graph, rewritten)
        if not any(o.domain == MS for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS, 1))
    drop_unused(graph, replaced)
    return model, carried


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _initializers(graph: onnx.GraphProto, weight: str, b: Blocks, op: str) -> list[str]:
    """The new initializers for ``weight``'s blocks as ``op`` takes them, added to ``graph``:
    their names, data (B), scales, then zero points and offsets ([k_blocks, N], for the float
    MatMul on the block sums) where there are any; named as ONNX Runtime's quantizer names them."""
    from onnx import numpy_helper

    data = b.packed()
    if op == "GatherBlockQuantized":  # [vocab, hidden (/ 2)]: each row's blocks side by side
        data = data.reshape(data.shape[0], -1)
    arrays = {f"{weight}_Q{b.bits}": data, f"{weight}_scales": b.scales.astype("float32")}
    zp = b.packed_zero_points()
    if zp is not None:
        arrays[f"{weight}_zero_points"] = zp
    if b.offsets is not None:
        arrays[f"{weight}_offsets"] = b.offsets.T.astype("float32")
    if op == "GatherBlockQuantized" and f"{weight}_Q{b.bits}" in {t.name for t in graph.initializer}:
        arrays = {f"{n}_gather": a for n, a in arrays.items()}  # read by MatMul and Gather: B is 3-D, data 2-D
    graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    return list(arrays)


BlockSums = dict[tuple[str, int], str]
"""(activation, block size) -> the tensor holding that activation's block sums, for one graph:
every split ``MatMulNBits`` on one activation shares one block-sum MatMul."""


def split_matmul_nbits(
    graph: onnx.GraphProto,
    sums: BlockSums,
    *,
    activation: str,
    output: str,
    prefix: str,
    name: str,
    weights: Sequence[str],
    offsets: str | None,
    attributes: Mapping[str, Any],
) -> list[onnx.NodeProto]:
    """The nodes computing ``output`` as ``MatMulNBits(activation, *weights)`` (``weights``: B,
    scales, then optional uint8 zero points, g_idx, bias, as the op numbers its inputs from 1)
    plus, where ``offsets`` names a float [k_blocks, N] initializer, ``block_sums(activation) @
    offsets``: the split form of a weight ``(q - z) * s + r`` with one float r per block. A
    weight with float zero points or Q4_1 offsets runs so on ONNX Runtime's fast prepacked (and,
    at ``accuracy_level`` 4, int8) kernels, which have no float zero points (module docstring);
    what those cannot hold is a [K/block, N] float MatMul, small beside the weight.

    ``attributes`` (K, N, bits, block_size, accuracy_level, ...) go onto ``MatMulNBits`` as they
    are. The block sums (``activation @ ones``, a [K, k_blocks] matrix from
    :func:`block_sum_matrix`; a last, partial block sums its rows only) are computed once per
    activation and block size and remembered in ``sums``; the caller puts the returned nodes
    where the node they replace was, so the first one using an activation precedes the rest.
    Node names start with ``prefix``; ``MatMulNBits`` is named ``name``."""
    from onnx import helper

    inputs = [activation, *weights]
    while inputs and not inputs[-1]:  # optional inputs left out at the end are dropped
        inputs.pop()
    if offsets is None:
        return [helper.make_node("MatMulNBits", inputs, [output], name=name, domain=MS, **attributes)]
    k, block = as_int(attributes["K"]), as_int(attributes["block_size"])
    nodes = []
    key = (activation, block)
    if key not in sums:  # sum_k over each block, once per activation
        sums[key] = f"{activation}_block_sums" if block == BLOCK else f"{activation}_block_sums_{block}"
        nodes.append(
            helper.make_node(
                "MatMul", [activation, block_sum_matrix(graph, k, block)], [sums[key]], name=f"{prefix}_block_sums"
            )
        )
    nodes += [
        helper.make_node("MatMulNBits", inputs, [f"{output}_codes"], name=name, domain=MS, **attributes),
        helper.make_node("MatMul", [sums[key], offsets], [f"{output}_offsets"], name=f"{prefix}_offsets"),
        helper.make_node("Add", [f"{output}_codes", f"{output}_offsets"], [output], name=f"{prefix}_offsets_add"),
    ]
    return nodes


def block_sum_matrix(graph: onnx.GraphProto, k: int, block: int = BLOCK) -> str:
    """A [K, ceil(K / block)] float initializer of ones on each block's rows (the last block's
    K % block where K is not a multiple): ``a @ it`` sums each block of the activation; added to
    ``graph`` once per (K, block), shared by every weight of that K."""
    import numpy as np
    from onnx import numpy_helper

    name = f"gguf.block_sums.{k}" if block == BLOCK else f"gguf.block_sums.{k}.{block}"
    if not any(t.name == name for t in graph.initializer):
        k_blocks = -(-k // block)
        ones = (np.arange(k)[:, None] // block == np.arange(k_blocks)[None, :]).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(ones, name))
    return name


def pack_zero_points(z: NDArray[np.generic], bits: int) -> U8:
    """uint8 zero points [N, k_blocks] as ``MatMulNBits`` takes them: 4-bit packed like B, two to
    a byte (block 2i in the low nibble, 2i + 1 in the high one, a row's last high nibble unused
    where k_blocks is odd), uint8 [N, ceil(k_blocks / 2)]; 8-bit as they are."""
    import numpy as np

    u8 = np.asarray(z, np.uint8)
    if bits == 8:
        return np.ascontiguousarray(u8)
    if u8.shape[1] % 2:
        u8 = np.concatenate([u8, np.zeros((u8.shape[0], 1), np.uint8)], axis=1)
    return np.ascontiguousarray(u8[:, 0::2] | (u8[:, 1::2] << 4)).astype(np.uint8)


# --------------------------------------------------------------------------- reading the GGUF


def _read(reader: GGUFReader, onnx_names: Sequence[str], outputs: Mapping[str, int]) -> dict[str, Mapped]:
    arch = str(_field(reader, "general.architecture") or "")
    tensors = {t.name: t for t in reader.tensors}
    layers = _int_field(reader, f"{arch}.block_count")
    name_map = _name_map(arch, layers)
    processor = _processor(reader, arch)
    heads = (
        _int_field(reader, f"{arch}.attention.head_count"),
        _int_field(reader, f"{arch}.attention.head_count_kv"),
    )
    cache: dict[tuple[str, str], _Part] = {}  # (gguf name, rows) -> one part
    out: dict[str, Mapped] = {}
    for onnx_name in onnx_names:
        parts = _sources(onnx_name, tensors, name_map, outputs.get(onnx_name))
        if isinstance(parts, str):
            out[onnx_name] = Mapped(onnx_name, (), None, parts)
            continue
        sources = tuple((g, tensors[g].tensor_type.name) for g, _ in parts)
        try:
            pieces = []
            for gguf_name, half in parts:
                key = (gguf_name, half)
                if key not in cache:
                    cache[key] = _part(tensors[gguf_name], half, processor, arch, heads)
                pieces.append(cache[key])
            out[onnx_name] = Mapped(onnx_name, sources, _merge(sources, pieces))
        except _NotCarried as e:
            out[onnx_name] = Mapped(onnx_name, sources, None, str(e))
    return out


def _field(reader: GGUFReader, key: str) -> object:
    f = reader.get_field(key)
    return None if f is None else f.contents()


def _int_field(reader: GGUFReader, key: str) -> int:
    """A count from the GGUF's metadata, 0 where it has none."""
    return as_int(_field(reader, key) or 0)


def as_int(value: object) -> int:
    """``int(value)`` for a value read from a file or an ONNX attribute, whose type only that
    file vouches for: a TypeError, as ``int()`` raises, for what is no number."""
    if isinstance(value, (str, bytes, SupportsInt, SupportsIndex)):
        return int(value)
    raise TypeError(f"int() argument must be a string or a number, not {type(value).__name__!r}")


def _name_map(arch: str, layers: int) -> TensorNameMap | None:
    """gguf's Hugging Face -> GGUF tensor name map for ``arch`` (what transformers' loader
    uses), or None where gguf does not know the architecture."""
    import gguf

    for key, value in gguf.MODEL_ARCH_NAMES.items():
        if value == arch:
            return gguf.get_tensor_name_map(key, layers)
    return None


def _gguf_name(hf_module: str, name_map: TensorNameMap | None) -> str | None:
    if name_map is not None:
        found = name_map.get_name(hf_module)
        if found is not None:
            return f"{found}.weight"
    if hf_module in _TOP:
        return f"{_TOP[hf_module]}.weight"
    m = _LAYER.fullmatch(hf_module)
    if m and m.group(2) in _LLAMA:
        return f"blk.{m.group(1)}.{_LLAMA[m.group(2)]}.weight"
    return None


def _sources(
    onnx_name: str, tensors: dict[str, ReaderTensor], name_map: TensorNameMap | None, n_out: int | None
) -> list[tuple[str, str]] | str:
    """The GGUF tensors whose rows make ``onnx_name``, in output order, each with which rows:
    ``all``, or ``first``/``second`` half (Phi-3 packs gate and up in one ``ffn_up``: taken so
    only without an ``ffn_gate`` and where ``ffn_up`` has twice ``n_out`` rows). A string says
    why there are none."""

    def doubled(name: str | None) -> bool:
        return name is not None and n_out is not None and int(tensors[name].data.shape[0]) == 2 * n_out

    def find(hf_module: str) -> str | None:
        name = _gguf_name(hf_module, name_map)
        return name if name in tensors else None

    if not onnx_name.endswith(".weight"):
        return "not a weight the fused decoder names after a Hugging Face parameter"
    module = onnx_name[: -len(".weight")]
    if module == "lm_head":  # tied: the embedding table
        got = find("lm_head") or find("model.embed_tokens")
        return [(got, "all")] if got else "no output.weight or token_embd.weight in the GGUF"
    m = _LAYER.fullmatch(module)
    if module == "model.embed_tokens" or m is None:
        got = find(module)
        return [(got, "all")] if got else f"no GGUF tensor maps to {module}"
    prefix, rest = f"model.layers.{m.group(1)}", m.group(2)
    if rest.startswith("attn."):  # the fused graph's attn.* is Hugging Face's self_attn.*
        rest = f"self_attn.{rest[len('attn.') :]}"
    if rest == "self_attn.qkv_proj":
        packed = find(f"{prefix}.self_attn.qkv_proj")
        if packed:
            return [(packed, "all")]
        qkv = [find(f"{prefix}.self_attn.{p}_proj") for p in "qkv"]
        if all(qkv):
            return [(str(g), "all") for g in qkv]
        return f"the GGUF has neither attn_qkv nor all of attn_q, attn_k, attn_v for layer {m.group(1)}"
    got = find(f"{prefix}.{rest}")
    if rest == "mlp.gate_proj" and got is None:
        packed = find(f"{prefix}.mlp.gate_up_proj")
        return [(str(packed), "first")] if doubled(packed) else f"no GGUF tensor maps to {module}"
    if rest == "mlp.up_proj" and doubled(got) and find(f"{prefix}.mlp.gate_proj") is None:
        return [(str(got), "second")]  # ffn_up is gate and up packed where there is no ffn_gate
    return [(got, "all")] if got else f"no GGUF tensor maps to {module}"


class _RowProcessor(Protocol):
    """What is used here of a transformers ``TensorProcessor`` (unannotated there)."""

    config: dict[str, object]

    def process(
        self,
        *,
        weights: NDArray[np.int64],
        name: str,
        tensor_key_mapping: dict[str, str],
        parsed_parameters: dict[str, object],
    ) -> _Processed: ...


class _Processed(Protocol):
    @property
    def weights(self) -> NDArray[np.generic]: ...


class _ProcessorClass(Protocol):
    def __call__(self, *, config: dict[str, object]) -> _RowProcessor: ...


def _processor(reader: GGUFReader, arch: str) -> _RowProcessor | None:
    """transformers' tensor processor for ``arch``, configured from the GGUF's metadata as
    transformers' loader configures it; None without transformers."""
    try:
        from transformers.integrations import ggml
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor
    except ImportError:
        return None
    mapping = ggml.GGUF_CONFIG_MAPPING.get(arch, {})  # GGUF key -> config attribute, or None
    config: dict[str, object] = {}
    for key, hf_key in mapping.items() if isinstance(mapping, dict) else ():
        value = _field(reader, f"{arch}.{key}")
        if hf_key is not None and value is not None:
            config[hf_key] = value
    processor: _ProcessorClass = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    return processor(config=config)


def _row_order(
    gguf_name: str, n: int, processor: _RowProcessor | None, arch: str, heads: tuple[int, int]
) -> NDArray[np.int64]:
    """The GGUF row behind each row transformers loads for ``gguf_name``: its tensor processor
    run on the row numbers (a processor that does more than reorder rows is refused). Without
    transformers, llama.cpp's Llama permutation undone as transformers undoes it, from the
    file's head counts (``heads``: query, key/value)."""
    import numpy as np

    rows = np.arange(n, dtype=np.int64).reshape(n, 1)
    if processor is not None:
        try:
            out = processor.process(
                weights=rows,
                name=gguf_name,
                tensor_key_mapping={},
                parsed_parameters={"config": processor.config, "tensors": {}},
            )
            order = np.asarray(out.weights)
        except Exception as e:  # any failure: the rows are not just reordered
            raise _NotCarried(f"transformers' {type(processor).__name__} failed on {gguf_name}'s row order: {e}") from e
    elif arch == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        count = heads[0] if ".attn_q." in gguf_name else heads[1]
        if count <= 0 or n % (2 * count):
            raise _NotCarried(f"{gguf_name}: no head count in the GGUF to undo llama.cpp's row permutation with")
        order = rows.reshape(count, n // count // 2, 2, 1).swapaxes(2, 1).reshape(n, 1)
    else:
        order = rows
    if order.shape != (n, 1) or not np.array_equal(np.sort(order[:, 0]), rows[:, 0]):
        raise _NotCarried(f"transformers' {type(processor).__name__} changes {gguf_name} beyond reordering its rows")
    return order[:, 0]


_Part = tuple[int, "U8", "F32", "U8 | None", "F32 | None", str, "U8"]
"""(bits, codes, scales, zero points, offsets, ggml type, raw rows): one GGUF tensor's rows."""


def _part(tensor: ReaderTensor, half: str, processor: _RowProcessor | None, arch: str, heads: tuple[int, int]) -> _Part:
    """One GGUF tensor's rows as blocks, in the order transformers loads them."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES

    kind = tensor.tensor_type.name
    if kind not in CARRIED:
        raise _NotCarried(
            f"{tensor.name} is {kind}; only {', '.join(CARRIED)} blocks are carried exactly (this one stays float)"
        )
    if len(tensor.data.shape) != 2:
        raise _NotCarried(f"{tensor.name} has {len(tensor.data.shape)} dimensions; only matrices are carried")
    block, size = GGML_QUANT_SIZES[tensor.tensor_type]
    assert block == BLOCK, (kind, block)
    raw = np.asarray(tensor.data, dtype=np.uint8)
    n = raw.shape[0]
    order = _row_order(tensor.name, n, processor, arch, heads)
    if half != "all":
        if n % 2:
            raise _NotCarried(f"{tensor.name} has an odd number of rows ({n}); it cannot be gate and up packed")
        order = order[: n // 2] if half == "first" else order[n // 2 :]
    raw = np.ascontiguousarray(raw[order])
    bits, codes, scales, zp, offsets = ggml_blocks(raw, kind)
    assert raw.shape[1] == codes.shape[1] * size
    return bits, codes, scales, zp, offsets, kind, raw


def ggml_blocks(raw: NDArray[np.generic], kind: str) -> tuple[int, U8, F32, U8 | None, F32 | None]:
    """ggml rows (uint8 [N, k_blocks * type_size]) of ``kind`` as (bits, codes uint8
    [N, k_blocks, 32], scales float32 [N, k_blocks], zero points: None for 2^(bits-1), else
    uint8 [N, k_blocks], offsets: None or float32 [N, k_blocks]) such that
    ``(codes - zp) * scales + offsets``, rounded to float32 at each step, is ggml's value."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    _, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(raw.shape[0], -1, size)

    def half(offset: int) -> F32:
        return np.ascontiguousarray(blocks[..., offset : offset + 2]).view(np.float16)[..., 0].astype(np.float32)

    def nibbles(qs: U8) -> U8:  # ggml: value j in the low nibble of byte j, j + 16 in its high one
        return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint8)

    d = half(0)
    if not np.isfinite(d).all():
        raise _NotCarried(f"{kind} scales that are not finite")
    if kind == "Q4_0":
        return 4, nibbles(blocks[..., 2:]), d, None, None
    if kind == "Q8_0":
        codes = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return 8, codes, d, None, None
    if kind != "Q4_1":
        raise _NotCarried(f"{kind} blocks are not carried")
    m = half(2)
    if not np.isfinite(m).all():
        raise _NotCarried("Q4_1 offsets that are not finite")
    codes = nibbles(blocks[..., 4:])
    # a block of d == 0 is m throughout: codes 1, scale m, zero point 0
    zero = d == 0
    codes[zero] = 1
    scales = np.where(zero, m, d).astype(np.float32)
    offsets = np.where(zero, np.float32(0), m)
    # the nearest whole zero point z (0..15) and what is left of m beside it, r = m + z * d: the
    # codes' part (q - z) * d is then centred as x is (ONNX Runtime's int8 compute quantizes the
    # activations against it), and |r| <= d / 2. z * d (a 4-bit integer times an fp16) is exact
    # in float32; r is kept only where it is too, else z = 0 and r = m. Then (q - z) * d + r,
    # two exact terms rounded once, is ggml's d * q + m bit for bit.
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(zero, np.float32(0), np.clip(np.rint(-m / np.where(zero, np.float32(1), d)), 0, 15)).astype(
            np.float32
        )
    r = (offsets + z * scales).astype(np.float32)
    kept = r.astype(np.float64) == offsets.astype(np.float64) + z.astype(np.float64) * scales.astype(np.float64)
    z, r = np.where(kept, z, np.float32(0)), np.where(kept, r, offsets)
    if not r.any():  # every offset a whole zero point: no offsets at all
        return 4, codes, scales, z.astype(np.uint8), None
    return 4, codes, scales, z.astype(np.uint8), r.astype(np.float32)


def _merge(sources: tuple[tuple[str, str], ...], parts: list[_Part]) -> Blocks:
    """The parts (q, k and v of a packed projection) as one weight's blocks along N: at the
    widest part's bits (4-bit codes are 8-bit codes with their zero points stored), zero points
    stored where any part needs them, offsets (0 for the parts without) where any part has them."""
    import numpy as np

    raw = tuple((kind, r) for *_, kind, r in parts)
    if len(parts) == 1:
        bits, codes, scales, zp, offsets, _, _ = parts[0]
        return Blocks(sources, bits, codes, scales, zp, offsets, raw)
    bits = max(p[0] for p in parts)
    if all(p[0] == bits and p[3] is None for p in parts):
        zp = None
    else:
        zp = np.concatenate(
            [np.full(p[2].shape, 2 ** (p[0] - 1), np.uint8) if p[3] is None else p[3] for p in parts], axis=0
        )
    offsets = None
    if any(p[4] is not None for p in parts):
        offsets = np.concatenate([np.zeros(p[2].shape, np.float32) if p[4] is None else p[4] for p in parts], axis=0)
    codes = np.concatenate([p[1] for p in parts], axis=0)
    scales = np.concatenate([p[2] for p in parts], axis=0)
    return Blocks(sources, bits, codes, scales, zp, offsets, raw)
