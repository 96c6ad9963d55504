"""Whether an int8 file computes the same on every x86 CPU.

ONNX Runtime's u8s8 GEMM (uint8 activations x int8 weights: every dynamic int8 MatMul, and a
static one with uint8 activations) runs on VNNI CPUs with ``vpdpbusd``, which adds each
product in 32 bits. Without VNNI (AVX2 only, or AVX-512 without VNNI) it runs ``vpmaddubsw``,
which adds each pair of products in 16 bits with saturation: 255 x 127 x 2 = 64,770 does
not fit in 32,767, so the same file gives other numbers there. Measured under QEMU's
EPYC-Milan model (Zen 3: AVX2, no AVX-512, no VNNI), a MatMulInteger of 64 products of
255 x 127: exact 2,072,640, ONNX Runtime 1.31 1,048,544; weights within [-64, 64] were exact
and -65 was not (tests/test_int8_portable.py). int8 x int8 (static with int8 activations) and
MatMulNBits (4- and 8-bit weight-only) measured exact under the same model.

Two ways out, both measured there: int8 weights within [-64, 64] (``reduce_range``, 7 bits)
compute the same in any session, and ONNX Runtime's ``session.x64quantprecision=1`` multiplies
8-bit weights as uint8 (u8u8), exactly and more slowly. onnxbuild keeps 8-bit weights by
default (all-MiniLM-L6-v2's least sentence cosine 0.982 against 0.976 in 7 bits) and sets the
option in every session on a CPU whose u8s8 saturates (runtimes/sessions.py); this module
finds the weights a session without it would saturate, for the validation report to name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import onnx
    from numpy.typing import NDArray

SAFE = 64
"""The largest |weight| a u8s8 pair of products cannot saturate at: 255 x 64 x 2 = 32,640."""

_U8S8 = {
    # op type -> (index of the activation's uint8 input, index of the int8 weight)
    "MatMulInteger": (0, 1),
    "DynamicQuantizeMatMul": (None, 1),  # quantizes its float input to uint8 itself
    "MatMulIntegerToFloat": (0, 1),
    "QLinearMatMul": (0, 3),
    "ConvInteger": (0, 1),
    "QLinearConv": (0, 3),
}


def saturating(model: onnx.ModelProto, array: Callable[[str], NDArray[np.generic]] | None = None) -> list[str]:
    """The int8 weights (initializer names) that a u8s8 kernel multiplies by uint8 activations
    and that hold a value outside [-SAFE, SAFE]: those compute otherwise on x86 without VNNI.
    A QDQ file is read through its DequantizeLinear nodes: what ONNX Runtime fuses into
    QLinearMatMul. ``array`` reads one initializer (a file's external data, one tensor at a
    time); by default the model holds them."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    read = array or (lambda name: numpy_helper.to_array(inits[name]))
    producer = {o: n for n in model.graph.node for o in n.output}

    def elem(name: str) -> int | None:
        if name in inits:
            return int(inits[name].data_type)
        node = producer.get(name)
        if node is None:
            return None
        if node.op_type in ("DynamicQuantizeLinear",):
            return TensorProto.UINT8
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            return int(inits[node.input[2]].data_type)
        return None

    def too_wide(name: str) -> bool:
        t = inits.get(name)
        if t is None or t.data_type != TensorProto.INT8:
            return False
        return bool(np.abs(read(name).astype(np.int16)).max(initial=0) > SAFE)

    found: list[str] = []
    for node in model.graph.node:
        pair = _U8S8.get(node.op_type)
        if pair is not None:
            act, weight = pair
            if len(node.input) <= weight:
                continue
            if (act is None or elem(node.input[act]) == TensorProto.UINT8) and too_wide(node.input[weight]):
                found.append(node.input[weight])
        elif node.op_type in ("MatMul", "Gemm", "Conv"):
            # QDQ: MatMul(DequantizeLinear(QuantizeLinear(x) as uint8), DequantizeLinear(int8 weight))
            sides = [producer.get(x) for x in node.input[:2]]
            if all(s is not None and s.op_type == "DequantizeLinear" for s in sides):
                a, w = sides
                assert a is not None and w is not None
                if elem(a.input[0]) == TensorProto.UINT8 and too_wide(w.input[0]):
                    found.append(w.input[0])
    return sorted(set(found))


def note(path: Path) -> str | None:
    """What the validation of the file at ``path`` on this CPU says of its int8 kernels: None
    for a file with no u8s8 MatMul or Conv."""
    import platform

    from onnxbuild.quant.weightcheck import open_file
    from onnxbuild.runtimes.sessions import U8S8_EXACT, config, u8s8_saturates

    weights = open_file(path)  # the graph, and one tensor at a time when asked (external data included)
    ops = {n.op_type for n in weights.model.graph.node}
    if not ops & set(_U8S8) and "DequantizeLinear" not in ops:
        return None
    found = saturating(weights.model, weights.array)
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    here = ("x86 without VNNI" if u8s8_saturates() else "x86 with VNNI") if x86 else "a non-x86 CPU"
    if not found:
        return f"int8 kernels: validated on {here}; every u8s8 weight within +-{SAFE}: the same on every x86 CPU"
    exact = "with session.x64quantprecision=1 (u8u8, exact)" if U8S8_EXACT.items() <= config().items() else "u8s8"
    return (
        f"int8 kernels: validated on {here}, {exact}; {len(found)} u8s8 weight tensors beyond +-{SAFE}: "
        "a session on an x86 CPU without VNNI (AVX2, AVX-512 without VNNI) computes them otherwise unless it "
        "sets session.x64quantprecision=1, as onnxbuild's do (or build with reduce_range: true)"
    )
