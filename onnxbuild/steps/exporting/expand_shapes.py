"""Expand shapes written without their ``Where``: a TorchScript export that OpenVINO runs on every CPU.

TorchScript writes ``x.expand(b, -1, s, t)`` as ``Expand(x, Where(Equal(S, -1), 1, S))`` with
``S = Concat(b, -1, s, t)``: a -1 in the requested shape means "keep that dimension", which
ONNX's Expand says with a 1. OpenVINO 2026.4's CPU plugin runs that ``Where`` on int32 shape
values in an AVX2 JIT kernel that treats them as float bit patterns; with denormals-are-zero
set on the calling thread (ONNX Runtime's ``session.set_denormal_as_zero``, PyTorch's
``set_flush_denormal``) every small dimension reads as 0 and the Expand behind it fails
("[CPU] Broadcast node ... Value -1 not in range"). GPT-2's causal mask has one.

Where each part of ``S`` is a constant or a dimension read from a ``Shape`` (never negative),
the Where can only turn the constant -1s into 1s: this pass writes that Concat with 1s and
points the Expand at it, so the file has no integer ``Where`` left on that path and runs in
OpenVINO whatever the caller's flags (tests/test_fpenv.py). Nothing else changes: where a part
may be negative at run time the node is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

_DIMENSION_OPS = frozenset({"Gather", "Unsqueeze", "Squeeze", "Reshape", "Slice", "Cast", "Identity"})
"""Ops whose output is a part of their first input: non-negative if it is."""
_SUM_OPS = frozenset({"Add", "Mul", "Max", "Concat"})
"""Ops whose output is non-negative when every input is."""
_DEPTH = 16  # a dimension's arithmetic is a few nodes deep; past this, leave the Where alone


_SHAPE_MAX = 64
"""The most elements a tensor read as a shape's part may have."""


def _shape_like(tensor: onnx.TensorProto) -> bool:
    from onnx import TensorProto

    count = 1
    for d in tensor.dims:
        count *= d
    return (
        tensor.data_type in (TensorProto.INT64, TensorProto.INT32) and count <= _SHAPE_MAX and not tensor.external_data
    )


class _Graph:
    """Who produces and who reads each name, and the constants, of one graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        # only small integer tensors can be parts of a shape: the weights are never converted (an
        # 8B export's would be a second copy of the model)
        self.constants: dict[str, NDArray[np.integer]] = {
            i.name: numpy_helper.to_array(i) for i in graph.initializer if _shape_like(i)
        }
        for n in graph.node:
            valued = n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"
            if valued and _shape_like(n.attribute[0].t):
                self.constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for n in graph.node:
            for k, name in enumerate(n.input):
                self.readers.setdefault(name, []).append((n, k))

    def non_negative(self, name: str, depth: int = 0) -> bool:
        """Whether every value of ``name`` is >= 0 whatever the inputs (a shape's arithmetic)."""
        import numpy as np

        if name in self.constants:
            return bool(np.all(self.constants[name] >= 0))
        node = self.producer.get(name)
        if node is None or depth > _DEPTH:
            return False
        if node.op_type in ("Shape", "Size"):
            return True
        if node.op_type in _DIMENSION_OPS:
            return self.non_negative(node.input[0], depth + 1)
        if node.op_type in _SUM_OPS:
            return all(self.non_negative(x, depth + 1) for x in node.input)
        return False


def _shape_concat(g: _Graph, where: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Concat behind ``Where(Equal(S, ...), ..., S)`` (through a Reshape to -1), when
    ``where`` reads as TorchScript's expand shape and feeds only Expand shapes."""
    readers = g.readers.get(where.output[0], [])
    if not readers or any(n.op_type != "Expand" or k != 1 for n, k in readers):
        return None
    equal = g.producer.get(where.input[0])
    if equal is None or equal.op_type != "Equal" or equal.input[0] != where.input[2]:
        return None
    source = g.producer.get(where.input[2])
    if source is not None and source.op_type == "Reshape":
        source = g.producer.get(source.input[0])
    return source if source is not None and source.op_type == "Concat" else None


def _kept_parts(g: _Graph, concat: onnx.NodeProto, prefix: str) -> list[onnx.NodeProto | str] | None:
    """The Concat's parts with each constant -1 as 1 (a new Constant node), or None when a
    part may be negative at run time (then the Where is needed)."""
    import numpy as np
    from onnx import helper, numpy_helper

    parts: list[onnx.NodeProto | str] = []
    for k, name in enumerate(concat.input):
        value = g.constants.get(name)
        if value is None:
            if not g.non_negative(name):
                return None
            parts.append(name)
        elif np.all((value >= 0) | (value == -1)):
            kept = np.where(value == -1, 1, value).astype(value.dtype)
            parts.append(helper.make_node("Constant", [], [f"{prefix}/part{k}"], value=numpy_helper.from_array(kept)))
        else:
            return None
    return parts


def run(model: onnx.ModelProto) -> int:
    """Rewrite every TorchScript expand shape in the main graph whose parts are dimensions or
    constants; returns how many, and drops the nodes left unread."""
    from onnx import helper

    g = _Graph(model.graph)
    outputs = {o.name for o in model.graph.output}
    rewritten = 0
    for where in [n for n in model.graph.node if n.op_type == "Where" and n.output[0] not in outputs]:
        concat = _shape_concat(g, where)
        if concat is None:
            continue
        prefix = f"{where.name or where.output[0]}/kept"
        parts = _kept_parts(g, concat, prefix)
        if parts is None:
            continue
        made = [p for p in parts if not isinstance(p, str)]
        names = [p if isinstance(p, str) else p.output[0] for p in parts]
        shape = helper.make_node("Concat", names, [f"{prefix}/shape"], name=f"{prefix}/shape", axis=0)
        at = list(model.graph.node).index(concat) + 1
        for offset, node in enumerate([*made, shape]):
            model.graph.node.insert(at + offset, node)
        for reader, k in g.readers[where.output[0]]:
            reader.input[k] = shape.output[0]
        rewritten += 1
    if rewritten:
        _drop_unread(model.graph)
    return rewritten


def _names_read(graph: onnx.GraphProto) -> Iterator[str]:
    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for sub in subgraphs:  # an If's branches read the outer graph's names
                yield from _names_read(sub)
                yield from (o.name for o in sub.output)


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove the main graph's nodes no node or graph output reads, until none is left."""
    while True:
        read = set(_names_read(graph)) | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in read for o in n.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)
