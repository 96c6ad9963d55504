"""Weights reached through an Identity: the TorchScript exporter writes a module called twice
(ALBERT's one shared layer, run once per layer) with its weight once and an Identity of it for
each later call. onnxruntime's quantizers take only an initializer as a MatMul's weight, so
they quantized the first call and left the others float: half of ALBERT's layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild._util import every_node
from onnxbuild.fusion.passes import Pass, set_nodes

if TYPE_CHECKING:
    import onnx


def weight_aliases(graph: onnx.GraphProto) -> dict[str, str]:
    """Each Identity output that is only another name for an initializer, and that initializer."""
    constants = {t.name for t in graph.initializer}
    return {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in constants}


PASS = Pass(
    "fold-weight-aliases",
    requires="any graph; TorchScript writes a shared module's later calls as Identity(initializer)",
    guarantees="every reader of an Identity of an initializer reads the initializer itself (a graph output stays)",
)


def fold_weight_aliases(model: onnx.ModelProto) -> int:
    """Every reader of such an Identity reads the initializer itself and the Identity goes (a
    graph output that is one stays, as a name the caller sees); how many went."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    aliases = {k: v for k, v in weight_aliases(graph).items() if k not in outputs}
    if not aliases:
        return 0
    for node in every_node(graph):  # an If's or a Loop's body may read one from the outer scope
        for i, name in enumerate(node.input):
            if name in aliases:
                node.input[i] = aliases[name]
    set_nodes(graph, [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in aliases)])
    return len(aliases)
