"""Eager attention left in a graph, rewritten as ONNX's ``Attention`` (opset 23).

ONNX Runtime's transformer optimizer fuses attention only where its patterns match, and on
transformers 5.x graphs of T5 (position bias and mask added one after the other, a ``Where``
mask) and of BART and Marian (a biased key projection, a masked cross attention) none do. What
every eager attention does is the same, though: ``Softmax(MatMul(Q, Kᵀ) [* scale] + bias...)``
then ``MatMul(·, V)``, with Q, K and V as [batch, heads, sequence, head_dim]. That is ONNX's
``Attention`` with 4-D inputs, the bias as its additive ``attn_mask`` and the scale given
(not the default 1/sqrt(head_dim): T5 does not scale). The rewrite keeps every tensor around it:
the nodes that make Q, K, V and the bias stay, and the output replaces the second MatMul's.

What is left unmatched (another axis, a non-constant scale) stays as it was: the graph is only
ever replaced by something that computes the same, and validation compares it with PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild.fusion.passes import Pass, live, set_nodes

if TYPE_CHECKING:
    import onnx

OPSET = 23
"""ONNX's Attention op appeared in opset 23."""
PASS = Pass(
    "attention",
    requires="eager attention: Softmax(MatMul(Q, Kᵀ) [* constant scale] + additive biases) then MatMul(·, V), 4-D",
    guarantees="each such chain is one ONNX Attention node (opset >= 23) with the same output name; "
    "nodes nothing reads any more are gone",
)


def fuse(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each eager attention as one ``Attention`` node, and how many were fused."""
    from onnx import helper, numpy_helper

    graph = model.graph
    made = {o: n for n in graph.node for o in n.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    constants = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            constants[n.output[0]] = n.attribute[0].t

    def scalar(name: str) -> float | None:
        tensor = constants.get(name)
        if tensor is None:
            return None
        value = numpy_helper.to_array(tensor)
        return float(value.reshape(-1)[0]) if value.size == 1 else None

    def only_user(name: str) -> bool:
        outputs = {o.name for o in graph.output}
        return len(users.get(name, [])) == 1 and name not in outputs

    added: list[onnx.NodeProto] = []
    replaced: dict[int, onnx.NodeProto] = {}
    count = 0
    for softmax in graph.node:
        if softmax.op_type != "Softmax" or _axis(softmax) not in (-1, 3):
            continue
        after = users.get(softmax.output[0], [])
        if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != softmax.output[0]:
            continue
        # walk up from the softmax: Adds (the biases), an optional constant Mul, the QKᵀ MatMul
        biases: list[str] = []
        scale = 1.0
        name = softmax.input[0]
        node = made.get(name)
        while node is not None and node.op_type in ("Add", "Mul") and only_user(name):
            if node.op_type == "Mul":
                factor = next((scalar(i) for i in node.input if scalar(i) is not None), None)
                if factor is None:
                    break
                scale *= factor
                name = next(i for i in node.input if scalar(i) is None)
            else:
                upstream = [
                    i for i in node.input if made.get(i) is not None and made[i].op_type in ("Add", "Mul", "MatMul")
                ]
                chain = next((i for i in upstream if _leads_to_qk(i, made)), None)
                if chain is None:
                    break
                biases.extend(i for i in node.input if i != chain)
                name = chain
            node = made.get(name)
        if node is None or node.op_type != "MatMul" or not only_user(name):
            continue
        q, kt = node.input
        transpose = made.get(kt)
        if transpose is None or transpose.op_type != "Transpose":
            continue
        perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
        if perm is None or sorted(perm) != [0, 1, 2, 3]:
            continue
        # K as [batch, heads, keys, head_dim]: the transpose's input, turned by the permutation
        # that undoes the last two axes' swap
        wanted = [perm[0], perm[1], perm[3], perm[2]]
        prefix = softmax.name.rsplit("/", 1)[0] if "/" in softmax.name else softmax.name
        if wanted == [0, 1, 2, 3]:
            k = transpose.input[0]
        else:
            k = f"{prefix}/attention_fusion/key"
            added.append(
                helper.make_node(
                    "Transpose", [transpose.input[0]], [k], f"{prefix}/attention_fusion/KeyTranspose", perm=wanted
                )
            )
        mask = ""
        if biases:
            mask = biases[0]
            for j, other in enumerate(biases[1:]):
                summed = f"{prefix}/attention_fusion/bias{j}"
                added.append(helper.make_node("Add", [mask, other], [summed], f"{prefix}/attention_fusion/Bias{j}"))
                mask = summed
        v = after[0].input[1]
        fused = helper.make_node(
            "Attention",
            [q, k, v, *([mask] if mask else [])],
            [after[0].output[0]],
            f"{prefix}/attention_fusion/Attention",
            scale=scale,
        )
        replaced[id(after[0])] = fused
        count += 1
    if not count:
        return model, 0
    kept = [replaced.get(id(n), n) for n in graph.node]
    set_nodes(graph, live([*kept, *added], graph))
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version < OPSET:
            imp.version = OPSET
    return model, count


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), -1)


def _leads_to_qk(name: str, made: dict[str, onnx.NodeProto]) -> bool:
    """``name`` comes from the QKᵀ MatMul through Adds and Muls only (the other operand of an Add
    is a bias)."""
    node = made.get(name)
    while node is not None and node.op_type in ("Add", "Mul"):
        nxt = [i for i in node.input if made.get(i) is not None and made[i].op_type in ("Add", "Mul", "MatMul")]
        if not nxt:
            return False
        node = made.get(nxt[0])
    return node is not None and node.op_type == "MatMul"
