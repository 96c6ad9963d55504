"""A mixture of experts' weight tables in 4 or 8 bits (``GatherBlockQuantized``).

A mixture-of-experts decoder exports its experts (onnxbuild's export switches transformers to
its ``batched_mm`` experts) as float tables ``[experts, out, in]`` that a ``Gather`` indexes with
each token's chosen experts before a batched MatMul. ``MatMulNBitsQuantizer`` quantizes only
MatMuls with a constant weight, so those tables, most of a Mixtral's bytes, stayed float32 in a
"4-bit" file (a tiny Mixtral's int4: 81% of the fp32 file's size).

Each such ``Gather`` becomes ONNX Runtime's ``GatherBlockQuantized`` (com.microsoft; its CPU
kernel takes a rank-3 table): the table stored as packed 4-bit (or 8-bit) integers with one
float scale and one zero point per block of ``block_size`` along the last axis, round to
nearest; the op dequantizes only the rows it gathers, so a decode step reads the chosen
experts' 4-bit weights. The arithmetic after it is unchanged (float batched MatMul).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

MS = "com.microsoft"


def expert_tables(model: onnx.ModelProto, block_size: int, exclude: list[str]) -> list[onnx.NodeProto]:
    """The Gathers of a float rank-3 initializer along axis 0 whose last axis is whole blocks:
    an expert table read by the chosen experts' indices (an embedding table is rank 2)."""
    from onnx import TensorProto

    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type != "Gather" or n.domain not in ("", "ai.onnx") or n.name in exclude:
            continue
        table = inits.get(n.input[0])
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        if (
            table is not None
            and table.data_type == TensorProto.FLOAT
            and len(table.dims) == 3
            and axis == 0
            and table.dims[2] % block_size == 0
        ):
            out.append(n)
    return out


def quantize_blocks(
    table: NDArray[np.float32], bits: int, block_size: int, symmetric: bool
) -> tuple[NDArray[np.uint8], NDArray[np.float32], NDArray[np.uint8]]:
    """``table`` [..., k] as unsigned ``bits``-bit values in blocks of ``block_size`` along k,
    GatherBlockQuantized's layout: data (4 bits: two per byte, the even index in the low
    nibble), scales [..., k / block], zero points (4 bits: packed the same way)."""
    import numpy as np

    top = (1 << bits) - 1
    blocks = table.reshape(*table.shape[:-1], table.shape[-1] // block_size, block_size).astype(np.float64)
    if symmetric:
        mid = 1 << (bits - 1)  # the zero point; values -(mid-1)..mid-1 around it, as int8's symmetric grid
        scale = np.abs(blocks).max(axis=-1) / (mid - 1)
        scale = np.where(scale == 0, 1.0, scale)
        zero = np.full(scale.shape, mid, dtype=np.float64)
    else:
        low, high = np.minimum(blocks.min(axis=-1), 0.0), np.maximum(blocks.max(axis=-1), 0.0)
        scale = (high - low) / top
        scale = np.where(scale == 0, 1.0, scale)
        zero = np.clip(np.rint(-low / scale), 0, top)
    q = np.clip(np.rint(blocks / scale[..., None]) + zero[..., None], 0, top).astype(np.uint8)
    q = q.reshape(table.shape)
    zero_u8 = zero.astype(np.uint8)
    if bits == 4:
        q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        if (table.shape[-1] // block_size) % 2:  # an odd count of blocks: the last byte half empty
            pad = [(0, 0)] * (zero_u8.ndim - 1) + [(0, 1)]
            zero_u8 = np.pad(zero_u8, pad)
        zero_u8 = (zero_u8[..., 0::2] | (zero_u8[..., 1::2] << 4)).astype(np.uint8)
    return q, scale.astype(np.float32), zero_u8


def experts_into_blocks(model: onnx.ModelProto, bits: int, block_size: int, symmetric: bool, exclude: list[str]) -> int:
    """Every expert table's Gather as a GatherBlockQuantized; the number rewritten."""
    from onnx import helper, numpy_helper

    gathers = expert_tables(model, block_size, exclude)
    if not gathers:
        return 0
    inits = {t.name: t for t in model.graph.initializer}
    users: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    for n in gathers:
        name = n.input[0]
        table = numpy_helper.to_array(inits[name])
        data, scales, zeros = quantize_blocks(table, bits, block_size, symmetric)
        q_name = f"{name}_Q{bits}G{block_size}"
        if not any(t.name == q_name for t in model.graph.initializer):
            model.graph.initializer.extend(
                [
                    numpy_helper.from_array(data, q_name),
                    numpy_helper.from_array(scales, f"{q_name}_scales"),
                    numpy_helper.from_array(zeros, f"{q_name}_zero_points"),
                ]
            )
        users[name] -= 1
        if users[name] == 0:  # the float table is read by nothing else: gone from the file
            model.graph.initializer.remove(inits[name])
        replaced = helper.make_node(
            "GatherBlockQuantized",
            [q_name, n.input[1], f"{q_name}_scales", f"{q_name}_zero_points"],
            list(n.output),
            name=f"{n.name}_Q{bits}",
            domain=MS,
            gather_axis=0,
            quantize_axis=2,
            block_size=block_size,
            bits=bits,
        )
        at = list(model.graph.node).index(n)
        model.graph.node.remove(n)
        model.graph.node.insert(at, replaced)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return len(gathers)
