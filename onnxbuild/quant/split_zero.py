"""Float zero points of 4-bit ``MatMulNBits`` split into whole ones plus a block-sum offset.

ONNX Runtime's HQQ quantizer (``HQQWeightOnlyQuantConfig`` with ``MatMulNBitsQuantizer``) writes
4-bit ``MatMulNBits`` with FLOAT zero points, ``x = (q - zp) * s`` (scales and zero points float
[N * k_blocks]). ONNX Runtime 1.31's CPU kernel has no prepacked path for float zero points: it
dequantizes the whole weight on every call, so an HQQ SmolLM2-135M decodes at 736 ms a token
(prefill of 128: 1200 ms) against 17.5 ms (411 ms) for the same model with uint8 zero points.

The same weight is exactly ``s * q - s * zp``, which is ggml's Q4_1 ``d * q + m`` with ``d = s``
and ``m = -s * zp``, and takes the same split form (onnxbuild/quant/gguf_exact.py): the nearest
whole zero point ``z = clip(rint(zp), 0, 15)`` goes into ``MatMulNBits`` as packed uint8 zero
points, which the fast (and, at ``accuracy_level`` 4, int8) kernels run, and what is left,
``r = s * (z - zp)`` per block (|r| <= s / 2 unless zp lies outside 0..15), is a float
[k_blocks, N] MatMul on the activation's per-block sums, added to the output:

    a @ W = a @ ((q - z) * s) + sum_blocks(a) @ r

No code changes and nothing is re-quantized; r is ``s * (z - zp)`` rounded once to float32, so
the outputs differ from the float-zero-point node's by rounding only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onnxbuild.fusion.passes import Pass

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

MS = "com.microsoft"
_FLOAT = 1  # onnx.TensorProto.FLOAT


PASS = Pass(
    "split-zero-points",
    requires="MatMulNBits with float zero points (HQQ's), which onnxruntime's int8-compute kernel does not take",
    guarantees="each is a MatMulNBits on uint8 codes plus a block-sum correction MatMul; no float zero point is left",
)


def split_float_zero_points(model: onnx.ModelProto) -> int:
    """Rewrites, in place, every 4-bit ``MatMulNBits`` (com.microsoft) of ``model`` whose zero
    points are a float32 initializer into the split form (module docstring), subgraphs included;
    returns how many it rewrote. Float zero points that nothing reads any more are removed.

    Each rewritten node keeps its name, inputs, bias (input 5, added by ``MatMulNBits`` as before)
    and attributes (``accuracy_level`` among them); nodes on one activation with one block size
    share one block-sum MatMul (also one a graph already has from :mod:`.gguf_exact`). Left as
    they are, uncounted: nodes with ``g_idx`` (input 4: the blocks are not runs of K, so the
    activation's block sums do not match them), with float16/bfloat16 zero points (the offset
    MatMul would sum the activation in half precision), with zero points or scales that are not
    constant initializers (a graph input may override them) or not finite, or of other shapes
    than [N * k_blocks] / [N, k_blocks]."""
    return _rewrite_graph(model.graph, {}, set())


def _rewrite_graph(graph: onnx.GraphProto, outer: Mapping[str, onnx.TensorProto], replaced: set[str]) -> int:
    """:func:`split_float_zero_points` on one graph and its subgraphs; ``outer`` holds the
    enclosing graphs' initializers, which a subgraph's nodes may read; ``replaced`` collects the
    float zero points rewritten, to drop from whichever graph holds them."""
    from onnxbuild.fusion.passes import drop_unused, replace_nodes
    from onnxbuild.quant.gguf_exact import BlockSums, split_matmul_nbits

    overridable = {i.name for i in graph.input}
    inits = dict(outer)
    for t in graph.initializer:
        if t.name in overridable:
            inits.pop(t.name, None)  # a graph input of that name may replace it: not a constant
        else:
            inits[t.name] = t

    count = 0
    for node in graph.node:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                count += _rewrite_graph(sub, inits, replaced)

    existing = _existing_block_sums(graph)
    sums: BlockSums = {}
    names = {t.name for t in graph.initializer}
    made: dict[tuple[str, str, int, int, int], tuple[str, str | None]] = {}
    rewritten: dict[int, list[onnx.NodeProto]] = {}
    for position, node in enumerate(graph.node):
        plan = _plan(node, inits)
        if plan is None:
            continue
        attrs, z, r = plan
        moved = []
        key = (node.input[0], int(attrs["block_size"]))
        if r is not None and key in existing and key not in sums:
            # block sums the graph already has: used from here on, and computed here if their
            # node comes later (it reads only the activation, which this node reads too)
            at, sums[key] = existing[key]
            if at > position:
                moved, rewritten[at] = [graph.node[at]], []
        zp_name = node.input[3]
        cache = (zp_name, node.input[2], int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"]))
        if cache not in made:
            made[cache] = _initializers(graph, names, zp_name, z, r)
        zp_u8, offsets = made[cache]
        rewritten[position] = moved + split_matmul_nbits(
            graph,
            sums,
            activation=node.input[0],
            output=node.output[0],
            prefix=node.name or node.output[0],
            name=node.name,
            weights=[node.input[1], node.input[2], zp_u8, *node.input[4:]],
            offsets=offsets,
            attributes=attrs,
        )
        replaced.add(zp_name)
        count += 1

    if rewritten:
        replace_nodes(graph, rewritten)
    drop_unused(graph, replaced)
    return count


def _plan(
    node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]
) -> tuple[dict[str, Any], NDArray[np.uint8], NDArray[np.float32] | None] | None:
    """For a node to rewrite: its attributes, the whole zero points z (uint8 [N, k_blocks]) and
    the offsets r (float32 [N, k_blocks], None where every zp is whole); None for any other
    node (see :func:`split_float_zero_points` for which are left)."""
    import numpy as np
    from onnx import helper, numpy_helper

    if node.op_type != "MatMulNBits" or node.domain != MS or len(node.input) < 4:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if int(attrs.get("bits", 4)) != 4 or "K" not in attrs or "N" not in attrs:
        return None
    if len(node.input) > 4 and node.input[4]:  # g_idx: blocks not in K order
        return None
    zp_t, s_t = inits.get(node.input[3]), inits.get(node.input[2])
    if zp_t is None or s_t is None or zp_t.data_type != _FLOAT or s_t.data_type != _FLOAT:
        return None
    k, n, block = int(attrs["K"]), int(attrs["N"]), int(attrs.get("block_size", 0))
    if block <= 0 or k <= 0 or n <= 0:
        return None
    k_blocks = -(-k // block)
    zp = numpy_helper.to_array(zp_t)
    s = numpy_helper.to_array(s_t)
    if zp.size != n * k_blocks or s.size != n * k_blocks or zp.ndim not in (1, 2) or s.ndim not in (1, 2):
        return None
    zp = zp.reshape(n, k_blocks).astype(np.float64)
    s = s.reshape(n, k_blocks).astype(np.float64)
    if not (np.isfinite(zp).all() and np.isfinite(s).all()):
        return None
    attrs["block_size"] = block
    # the nearest whole zero point keeps (q - z) centred as x is (what the int8 kernels quantize
    # the activation against); r = s * (z - zp), computed in float64 and rounded once
    z = np.clip(np.rint(zp), 0, 15)
    r = (s * (z - zp)).astype(np.float32)
    return attrs, z.astype(np.uint8), (r if r.any() else None)


def _initializers(
    graph: onnx.GraphProto, names: set[str], zp_name: str, z: NDArray[np.uint8], r: NDArray[np.float32] | None
) -> tuple[str, str | None]:
    """The packed uint8 zero points and (where any) the [k_blocks, N] offsets, added to
    ``graph`` under names free in ``names`` (which they join), after the float zero points'."""
    from onnx import numpy_helper

    from onnxbuild.quant.gguf_exact import pack_zero_points

    base = zp_name[: -len("_zero_points")] if zp_name.endswith("_zero_points") else zp_name

    def free(name: str) -> str:
        out, i = name, 1
        while out in names:
            out, i = f"{name}_{i}", i + 1
        names.add(out)
        return out

    zp_u8 = free(f"{base}_zero_points_uint8")
    graph.initializer.append(numpy_helper.from_array(pack_zero_points(z, 4), zp_u8))
    if r is None:
        return zp_u8, None
    offsets = free(f"{base}_offsets")
    graph.initializer.append(numpy_helper.from_array(r.T.copy(), offsets))
    return zp_u8, offsets


def _existing_block_sums(graph: onnx.GraphProto) -> dict[tuple[str, int], tuple[int, str]]:
    """Block sums ``graph`` already computes (``MatMul(a, gguf.block_sums.K[.block])``, from
    :mod:`.gguf_exact` or an earlier call): (activation, block size) -> (the first such node's
    position, its output), for new split nodes on the same activation to reuse."""
    from onnxbuild.quant.gguf_exact import BLOCK

    found: dict[tuple[str, int], tuple[int, str]] = {}
    for position, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        parts = node.input[1].split(".")
        if parts[:2] != ["gguf", "block_sums"] or len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[2:]):
            continue
        block = int(parts[3]) if len(parts) == 4 else BLOCK
        found.setdefault((node.input[0], block), (position, node.output[0]))
    return found
