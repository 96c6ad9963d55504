"""Every tensor's shape at concrete input shapes, for counting work (steps/graphwork.py): ONNX's
shape inference on a light copy of the graph (weights reduced to their dims), with onnxruntime's
symbolic inference for its contrib ops and ONNX's Attention.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import onnx


SMALL_INITIALIZER = 1024
"""Initializers with fewer elements keep their values for shape inference (a Reshape's
shape, a Slice's ends); bigger ones are weights, and only their dims are needed."""


Shape = tuple[int, ...]


class _Symbolic(Protocol):
    """onnxruntime's SymbolicShapeInference, as far as ONNX's Attention reads and writes it."""

    known_vi_: dict[str, onnx.ValueInfoProto]


def light_copy(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy for shape inference, the graph inputs fixed to ``shapes``. Small initializers
    are copied; big ones become graph inputs of their type and shape, so the weights are
    not copied (a 500 MB model costs no second 500 MB): shape inference needs only their
    dims."""
    import onnx

    from onnxbuild.fusion.passes import set_nodes

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    set_nodes(graph, model.graph.node)
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


def inferred_shapes(light: onnx.ModelProto) -> dict[str, tuple[int | None, ...] | None]:
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
            if resolved(found.get(name)) is None:
                found[name] = shape
    return found


def _onnx_attention(symbolic: _Symbolic, node: onnx.NodeProto) -> None:
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


def resolved(shape: tuple[int | None, ...] | None) -> Shape | None:
    if shape is None or any(d is None for d in shape):
        return None
    return tuple(d for d in shape if d is not None)
