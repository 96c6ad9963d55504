"""Weight-only quantization one MatMul at a time, for files whose weights are external data.

onnxruntime's ``MatMulNBitsQuantizer`` takes a whole model in memory: a Llama-3.2-1B shape's
4.94 GB of float weights, its quantized copy and the quantizer's temporaries came to 8.0 GB
for 8 bits. Here the graph is read without its weights; each MatMul with a constant weight is
quantized with that weight alone by the same function the in-memory path uses (so the same
quantizer, options and post-passes; round-to-nearest straight from its kernel), and its new node and
tensors are put back, the tensors appended to the output's data file at once. The float
weights that stay (a tied embedding's table, norms) are copied over in chunks. So the step
holds one float weight and its quantized form at a time.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from onnxbuild.fusion.passes import Pass, set_nodes

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import onnx
    from numpy.typing import NDArray

M = TypeVar("M", "onnx.NodeProto", "onnx.TensorProto")

ALIGN = 4096
"""Offsets of tensors in the data file, as the fused graph writes them: ONNX Runtime maps
page-aligned external data instead of copying it."""
INLINE_BELOW = 1024
PIECE_BYTES = 128 << 20
"""A float weight larger than this is quantized in pieces of whole columns (:func:`quantized`)."""
_CHUNK = 64 << 20


PASS = Pass(
    "streamed-weight-only",
    requires="a model with external data whose MatMuls take 2-D float initializers",
    guarantees="each such MatMul is a MatMulNBits, quantized one at a time and written to one new data file",
)


def quantize(
    src: Path, out: Path, skip: set[str], one: Callable[[onnx.NodeProto, NDArray[np.generic]], onnx.ModelProto]
) -> tuple[int, str]:
    """``src`` (with external data) quantized into ``out`` and ``<out>.data``, node by node:
    ``one`` quantizes a MatMul with its weight or a piece of it (:func:`quantized`); nodes
    named in ``skip`` stay float. Returns the number of nodes quantized and the data file's name."""
    import onnx
    from onnx import external_data_helper

    from onnxbuild.quant.weightcheck import open_file

    file = open_file(src)
    model = file.model
    graph = model.graph
    location = f"{out.name}.data"
    nodes: list[onnx.NodeProto] = []
    made: dict[str, onnx.TensorProto] = {}
    count = 0

    def work(node: onnx.NodeProto) -> onnx.ModelProto | None:
        weight = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else ""
        if not weight or weight not in file.tensors or node.name in skip:
            return None
        return quantized(node, file.array(weight), one)

    # one MatMul at a time: two threads measured no faster (a 1B model's 4-bit: 39 s either way)
    with open(out.with_name(location), "wb") as data:
        for node in graph.node:
            made_here = work(node)
            if made_here is None or all(n.op_type == "MatMul" for n in made_here.graph.node):  # left float
                nodes.append(node)
                continue
            count += 1
            # copies: a message taken out of the one-node model would keep all of it alive, float weight included
            for n in made_here.graph.node:
                if not any(n.output[0] in done.output for done in nodes):  # a block-sum MatMul two nodes share
                    nodes.append(_copy(n, onnx.NodeProto))
            for t in made_here.graph.initializer:
                if t.name not in made and t.name not in file.tensors:
                    made[t.name] = _placed(_copy(t, onnx.TensorProto), data, location)
            del made_here
        used = {i for n in nodes for i in n.input} | {i for n in nodes for a in n.attribute for i in _graph_inputs(a)}
        kept = []
        for t in graph.initializer:
            if t.name not in used:
                continue
            if external_data_helper.uses_external_data(t):
                kept.append(_copied(t, file.folder, data, location))
            else:
                kept.append(t)
    set_nodes(graph, nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(made.values()))
    opsets = {o.domain: o.version for o in model.opset_import}
    if "com.microsoft" not in opsets:
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.save_model(model, str(out))
    return count, location


def _copy(message: M, kind: type[M]) -> M:
    out = kind()
    out.CopyFrom(message)
    return out


def _graph_inputs(attr: onnx.AttributeProto) -> list[str]:
    graphs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
    return [i for g in graphs for n in g.node for i in n.input]


def quantized(
    node: onnx.NodeProto,
    array: NDArray[np.generic],
    one: Callable[[onnx.NodeProto, NDArray[np.generic]], onnx.ModelProto],
) -> onnx.ModelProto:
    """``node`` with its weight ``array`` [K, N] quantized; a weight over PIECE_BYTES in pieces of
    whole columns (output features), which every weight-only method quantizes apart, joined
    again: the quantizers' temporaries are several times their input (Llama-3.2-1B's 1 GB
    lm_head took 8-bit quantization to 9.0 GB whole). HQQ's search stops on the mean error of
    what it is given, so its pieces may stop at other steps than the whole would."""
    import numpy as np

    k, n = array.shape
    if array.nbytes <= PIECE_BYTES:
        return one(node, array)
    cols = max(2, PIECE_BYTES // (k * array.itemsize))
    bounds = [*range(0, n, cols), n]
    pieces = list(pairwise(bounds))
    if len(pieces) > 1 and pieces[-1][1] - pieces[-1][0] == cols:  # a last piece of another size shows the axes
        a, b = pieces.pop()
        pieces += [(a, a + cols // 2), (a + cols // 2, b)]
    parts = [one(node, np.ascontiguousarray(array[:, a:b])) for a, b in pieces]
    return _joined(parts, n)


def _joined(parts: list[onnx.ModelProto], n: int) -> onnx.ModelProto:
    """The pieces' models as one: each tensor joined on the axis whose size differs between the
    first and the last piece (none: the same in all, kept once); MatMulNBits' N set to ``n``."""
    import numpy as np
    from onnx import helper, numpy_helper

    first, last = parts[0], parts[-1]
    ends = {t.name: tuple(t.dims) for t in last.graph.initializer}
    joined = []
    for t in first.graph.initializer:
        arrays = [numpy_helper.to_array(next(u for u in p.graph.initializer if u.name == t.name)) for p in parts]
        axes = [i for i, (a, b) in enumerate(zip(t.dims, ends[t.name], strict=True)) if a != b]
        value = np.concatenate(arrays, axis=axes[0]) if axes else arrays[0]
        joined.append(numpy_helper.from_array(value, t.name))
    for node in first.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "N":
                attr.CopyFrom(helper.make_attribute("N", n))
    del first.graph.initializer[:]
    first.graph.initializer.extend(joined)
    return first


def rounded(
    node: onnx.NodeProto, array: NDArray[np.generic], bits: int, block: int, symmetric: bool, level: int
) -> onnx.ModelProto | None:
    """``node`` at ``bits`` by round-to-nearest, straight from onnxruntime's kernel: the nodes
    and tensors ``MatMulNBitsQuantizer`` writes for it, without building a one-node model for
    it to read (a 64 MB weight: 0.22 s of the 0.41 its quantization took, the kernel 0.11).
    None where the quantizer does more than round (not 4 or 8 bits, not a float32 matrix)."""
    import numpy as np
    from onnx import TensorProto, helper
    from onnxruntime.capi import _pybind_state as kernels

    if bits not in (4, 8) or array.dtype != np.float32 or array.ndim != 2:
        return None
    k, n = array.shape
    blocks = -(-k // block)
    weights = np.ascontiguousarray(array)
    if blocks * block != k:
        weights = np.pad(weights, ((0, blocks * block - k), (0, 0)))
    per_byte = 8 // bits
    packed = np.zeros((n, blocks, -(-block // per_byte)), dtype=np.uint8)
    zero = np.zeros((n, -(-blocks // per_byte)), dtype=np.uint8)
    scales = np.zeros((n, blocks), dtype=np.float32)
    kernel = kernels.quantize_matmul_4bits if bits == 4 else kernels.quantize_matmul_8bits
    kernel(packed, weights, scales, zero, block, n, k, symmetric)
    del weights
    name = node.input[1]

    def tensor(suffix: str, value: NDArray[np.generic]) -> TensorProto:
        return TensorProto(
            name=f"{name}{suffix}",
            dims=value.shape,
            data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
            raw_data=value.tobytes(),
        )

    tensors = [tensor(f"_Q{bits}", packed), tensor("_scales", scales)]
    if not symmetric:
        tensors.append(tensor("_zero_points", zero))
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, **({"accuracy_level": level} if level else {})}
    made = helper.make_node(
        "MatMulNBits",
        [node.input[0], *(t.name for t in tensors)],
        list(node.output),
        name=f"{node.name}_Q{bits}" if node.name else "",
        domain="com.microsoft",
        **attrs,
    )
    return helper.make_model(helper.make_graph([made], "one", [], [], tensors))  # read for its node and tensors


def alone(node: onnx.NodeProto, array: NDArray[np.generic]) -> onnx.ModelProto:
    """``node`` as a model of its own with its weight ``array``, its activation of unknown shape."""
    from onnx import TensorProto, helper

    # the bytes as they are (numpy_helper.from_array took 0.2 s for a 64 MB weight, its quantization 0.12)
    weight = TensorProto(
        name=node.input[1],
        dims=array.shape,
        data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
        raw_data=array.tobytes(),
    )
    x = helper.make_tensor_value_info(node.input[0], weight.data_type, None)
    y = helper.make_tensor_value_info(node.output[0], weight.data_type, None)
    alone = helper.make_model(
        helper.make_graph([node], "one", [x], [y], [weight]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    alone.ir_version = 10
    return alone


def _placed(tensor: onnx.TensorProto, data: BinaryIO, location: str) -> onnx.TensorProto:
    """``tensor`` with its bytes appended to ``data`` (page-aligned), or as it is if small."""
    raw = tensor.raw_data
    if len(raw) < INLINE_BELOW:
        return tensor
    offset = _align(data)
    data.write(raw)
    tensor.ClearField("raw_data")
    return _point(tensor, location, offset, len(raw))


def _copied(tensor: onnx.TensorProto, folder: Path, data: BinaryIO, location: str) -> onnx.TensorProto:
    """An external float tensor that stays, its bytes copied into ``data`` in chunks."""
    where = {e.key: e.value for e in tensor.external_data}
    path = (folder / where["location"]).resolve()
    if folder.resolve() not in path.parents:
        raise ValueError(f"{tensor.name}: external data {where['location']!r} is outside the model's folder")
    start, length = int(where.get("offset", 0)), int(where["length"])
    offset = _align(data)
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left:
            chunk = f.read(min(_CHUNK, left))
            data.write(chunk)
            left -= len(chunk)
    return _point(tensor, location, offset, length)


def _point(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> onnx.TensorProto:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = tensor.EXTERNAL
    return tensor


def _align(data: BinaryIO) -> int:
    here = data.tell()
    pad = -here % ALIGN
    if pad:
        data.write(b"\0" * pad)
    return here + pad
