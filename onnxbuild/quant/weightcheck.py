"""The weights check: every quantized weight of a variant, dequantized, against the float
weight of the file it was made from.

An output gate cannot see a wrong weight on random-init weights: their logits are near-flat,
and in a tiny Llama's int4 variant a scale made 2x or -1x too large in a middle layer moved
the logits no more than 4-bit rounding does (relative error 0.132 against 0.132, top-1 0.75
against 0.78). The weights themselves can be checked at any size, with any weights: a
quantizer maps each weight to within a step or so of its value, so the dequantized tensor's
relative error ``||deq - w|| / ||w||`` stays at the bits' rounding noise (4-bit blocks of 32:
about 0.08; 8 bits: about 0.005) and a wrong scale, sign or tensor lands far above it. One
tensor is read at a time (external data included), so the check holds no model twice.

Read here: MatMulNBits (4 or 8 bits, in blocks, with or without zero points, integer or float
as HQQ writes them), and the int8 tensors of onnxruntime's dynamic and static quantizers
(``<w>_quantized`` with ``<w>_scale`` and ``<w>_zero_point``). A quantized tensor whose float
weight the base file does not hold under its name (a GGUF's own blocks, an expert table) is
counted as not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

REL_MAX = {4: 0.25, 8: 0.03}
"""The largest relative error a right tensor of so many bits may have: about 3x the rounding
noise of a Gaussian block (4 bits, blocks of 32: 0.08; 8 bits: 0.005), far below a wrong
scale's (2x: 1.0; -1x: 2.0)."""
STEP_SHARE = 0.6
"""Or, where it is larger, this share of the norm of the tensor's own quantization steps:
round-to-nearest moves each weight at most half a step (0.5), HQQ a little more. A table
quantized with one scale (onnxruntime's uint8 embeddings) has steps set by its outliers:
all-MiniLM-L6-v2's position embeddings, 8 bits, relative error 0.0955, right."""


class WorstTensor(TypedDict):
    name: str
    bits: int
    rel_error: float
    rel_max: float


class WeightCheck(TypedDict):
    """reports/validation/<variant>.json's ``weights``: what was checked and the worst tensor."""

    checked: int
    not_checked: list[str]
    worst: WorstTensor | None
    failed: list[WorstTensor]
    passed: bool


@dataclass(frozen=True)
class WeightFile:
    model: onnx.ModelProto
    folder: Path
    tensors: dict[str, onnx.TensorProto]

    def array(self, name: str) -> NDArray[np.generic]:
        """One initializer as an array, its external data read for it alone. Read here, not by
        onnx's loader, which refuses data the engine hard-links from the cache."""
        import numpy as np
        from onnx import external_data_helper, helper, numpy_helper

        tensor = self.tensors[name]
        if not external_data_helper.uses_external_data(tensor):
            return numpy_helper.to_array(tensor)
        where = {e.key: e.value for e in tensor.external_data}
        path = (self.folder / where["location"]).resolve()
        if self.folder.resolve() not in path.parents:
            raise ValueError(f"{name}: external data {where['location']!r} is outside the model's folder")
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims)) if tensor.dims else 1
        out = np.empty(count, dtype=dtype)  # writable, as the quantizers that take the array from here expect
        with open(path, "rb", buffering=0) as f:
            f.seek(int(where.get("offset", 0)))
            # read into the array itself: bytes and a bytearray copied 4.9 GB twice more at 1B
            done = f.readinto(out.data.cast("B"))
        if done != out.nbytes:
            raise ValueError(f"{name}: external data {where['location']!r} ends {out.nbytes - done} bytes early")
        return out.reshape(tuple(tensor.dims))


def open_file(path: Path) -> WeightFile:
    import onnx

    model = onnx.load_model(str(path), load_external_data=False)
    return WeightFile(model, path.parent, {t.name: t for t in model.graph.initializer})


Dequantized = Callable[[], "tuple[NDArray[np.float32], float] | None"]
"""A quantized tensor's float value, computed when called: one tensor is held at a time."""


def nbits(node: onnx.NodeProto, file: WeightFile) -> tuple[str, int, Dequantized] | None:
    """A MatMulNBits node's float weight name, bits and dequantized [K, N] weight."""
    from onnx import helper

    sizes = {
        a.name: int(helper.get_attribute_value(a)) for a in node.attribute if a.name in ("bits", "block_size", "K", "N")
    }
    bits = sizes.setdefault("bits", 4)  # the op's default
    packed_name = node.input[1]
    suffix = f"_Q{bits}"
    if not packed_name.endswith(suffix) or packed_name not in file.tensors:
        return None
    return packed_name[: -len(suffix)], bits, lambda: _nbits_value(node, file, sizes)


def _nbits_value(node: onnx.NodeProto, file: WeightFile, sizes: dict[str, int]) -> tuple[NDArray[np.float32], float]:
    import numpy as np

    bits, block, k, n = sizes["bits"], sizes["block_size"], sizes["K"], sizes["N"]
    blocks = math.ceil(k / block)
    packed = file.array(node.input[1]).astype(np.uint8, copy=False).reshape(n, blocks, -1)
    unpacked = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, -1) if bits == 4 else packed
    q = unpacked[:, :, :block].astype(np.float32)
    del packed, unpacked
    scales = file.array(node.input[2]).astype(np.float32).reshape(n, blocks)
    # float32 throughout, in place: a float64 zero point made a 1B model's 1 GB head 2 GB more, twice
    zero: NDArray[np.float32] = np.full((n, blocks), 2.0 ** (bits - 1), dtype=np.float32)
    if len(node.input) > 3 and node.input[3]:
        zp = file.array(node.input[3])
        if zp.dtype == np.uint8 and bits == 4:  # two per byte, low nibble first, rows padded to a byte
            row = zp.astype(np.uint8).reshape(n, -1)
            zero = np.stack([row & 0x0F, row >> 4], axis=-1).reshape(n, -1)[:, :blocks].astype(np.float32)
        else:
            zero = zp.astype(np.float32).reshape(n, blocks)
    q -= zero[:, :, None]
    q *= scales[:, :, None]
    out: NDArray[np.float32] = q.reshape(n, blocks * block)[:, :k].T
    return out, float(np.sqrt(block * np.square(scales, dtype=np.float64).sum()))


def _int8(name: str, file: WeightFile, axis: int | None) -> tuple[str, int, Dequantized] | None:
    """An onnxruntime int8 tensor ``<w>_quantized``'s float name and dequantized value, its
    scales along ``axis`` (a DequantizeLinear's; MatMulInteger's weights: per column, the last)."""
    base = name[: -len("_quantized")]
    if f"{base}_scale" not in file.tensors:
        return None
    return base, 8, lambda: _int8_value(name, file, axis)


def _int8_value(name: str, file: WeightFile, axis: int | None) -> tuple[NDArray[np.float32], float] | None:
    import numpy as np

    base = name[: -len("_quantized")]
    scale_name = f"{base}_scale"
    q = file.array(name).astype(np.float32)
    scale = file.array(scale_name).astype(np.float32)
    zp_name = f"{base}_zero_point"
    zero = file.array(zp_name).astype(np.float32) if zp_name in file.tensors else np.zeros_like(scale)
    if scale.size > 1:  # per channel
        axis = q.ndim - 1 if axis is None else axis % q.ndim
        if q.shape[axis] != scale.size:
            return None
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    out: NDArray[np.float32] = (q - zero) * scale
    steps = float(np.sqrt(np.square(np.broadcast_to(scale, q.shape), dtype=np.float64).sum()))
    return out, steps


def check(variant: Path, base: Path) -> WeightCheck:
    """Each quantized weight of ``variant`` against ``base``'s float weight of the same name."""
    import numpy as np
    from onnx import TensorProto, helper

    quant, floats = open_file(variant), open_file(base)
    found: list[tuple[str, int, Dequantized]] = []
    not_checked: list[str] = []
    for node in quant.model.graph.node:
        if node.op_type == "MatMulNBits":
            got = nbits(node, quant)
            if got is None:
                not_checked.append(node.input[1])
            else:
                found.append(got)
    int8 = (TensorProto.INT8, TensorProto.UINT8)
    axes = {
        n.input[0]: next((int(helper.get_attribute_value(a)) for a in n.attribute if a.name == "axis"), 1)
        for n in quant.model.graph.node
        if n.op_type == "DequantizeLinear"
    }
    # a ConvInteger's weights [out, in, kh, kw] are quantized per output channel
    axes |= {n.input[1]: 0 for n in quant.model.graph.node if n.op_type == "ConvInteger" and len(n.input) > 1}
    for name, tensor in quant.tensors.items():
        if name.endswith("_quantized") and tensor.data_type in int8 and len(tensor.dims) >= 2:
            got = _int8(name, quant, axes.get(name))
            (found.append(got) if got is not None else not_checked.append(name))
    # a Gemm with transB reads its weight as [out, in]; a quantizer that turns the Gemm into a
    # MatMulInteger writes it [in, out], one that keeps the Gemm (QDQ) keeps its layout
    transposed = {
        n.input[1]
        for n in floats.model.graph.node
        if n.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in n.attribute)
    }
    dequantized = {n.output[0]: n.input[0] for n in quant.model.graph.node if n.op_type == "DequantizeLinear"}
    transposed -= {
        dequantized.get(n.input[1], n.input[1]).removesuffix("_quantized")
        for n in quant.model.graph.node
        if n.op_type == "Gemm"
    }
    results: list[WorstTensor] = []
    for name, bits, value in found:
        if name not in floats.tensors:
            not_checked.append(name)
            continue
        computed = value()
        if computed is None:  # its scales lie along no axis of its size
            not_checked.append(name)
            continue
        deq, steps = computed
        w = floats.array(name).astype(np.float32)
        if name in transposed and w.ndim == 2:
            w = w.T
        if w.shape != deq.shape:
            not_checked.append(name)
            continue
        norm = float(np.linalg.norm(w))
        rel = float(np.linalg.norm(deq - w)) / norm if norm > 0 else float(np.abs(deq).max())
        # rounding moves each weight at most half its own step: where the steps are coarse (one
        # scale for a whole table with outliers) that is the bound, else the bits' own
        bound = max(REL_MAX[bits], STEP_SHARE * steps / norm if norm > 0 else 0.0)
        results.append({"name": name, "bits": bits, "rel_error": rel, "rel_max": bound})
    failed = [r for r in results if not r["rel_error"] <= r["rel_max"]]
    worst = max(results, key=lambda r: r["rel_error"] / r["rel_max"], default=None)
    return {
        "checked": len(results),
        "not_checked": sorted(set(not_checked)),
        "worst": worst,
        "failed": failed,
        "passed": not failed,
    }


class _Tensors:
    """A model's initializers by name, as a :class:`WeightFile` reads them (held in memory)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.tensors = {t.name: t for t in model.graph.initializer}

    def array(self, name: str) -> NDArray[np.generic]:
        from onnx import numpy_helper

        return numpy_helper.to_array(self.tensors[name])


def written(model: onnx.ModelProto, name: str, w: NDArray[np.float32]) -> WorstTensor | None:
    """The MatMulNBits of ``model`` (a node and its tensors, as the fused writer quantizes one
    MatMul) against the float weight ``w`` [K, N] it was made from, with :func:`check`'s bound;
    None where ``model`` has no MatMulNBits."""
    import numpy as np
    from onnx import helper

    node = next((n for n in model.graph.node if n.op_type == "MatMulNBits"), None)
    if node is None:
        return None
    sizes = {
        a.name: int(helper.get_attribute_value(a)) for a in node.attribute if a.name in ("bits", "block_size", "K", "N")
    }
    sizes.setdefault("bits", 4)
    deq, steps = _nbits_value(node, _Tensors(model), sizes)  # type: ignore[arg-type]  # reads as a WeightFile does
    norm = float(np.linalg.norm(w))
    rel = float(np.linalg.norm(deq - w)) / norm if norm > 0 else float(np.abs(deq).max())
    bound = max(REL_MAX[sizes["bits"]], STEP_SHARE * steps / norm if norm > 0 else 0.0)
    return {"name": name, "bits": sizes["bits"], "rel_error": rel, "rel_max": bound}
