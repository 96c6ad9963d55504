"""Graph rewrites as passes, and the one place a graph's node list is rewritten.

Each rewrite of an ONNX graph (a fusion, the GGUF carry, split zero points, folded weight
aliases, the streamed quantizer's join) declares itself as a :class:`Pass`: what it requires
of the model it is given, what it guarantees of the model it leaves, and, each time it runs,
how many rewrites it made (0: the model is unchanged). The steps that run them record that in
their reports (optimize.json's ``passes``).

The node list itself is replaced only here (:func:`set_nodes`, :func:`replace_nodes`), nodes
nothing reads any more are dropped only here (:func:`live`), and initializers nothing reads
any more likewise (:func:`drop_unused`): the rewrites build the nodes they add and say which
nodes they replace, and never edit ``graph.node`` by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class Pass:
    """A rewrite of ONNX graphs: its name, what it requires and what it guarantees."""

    name: str
    requires: str
    """What the model must be for the rewrite to apply; a model that is not is left unchanged."""
    guarantees: str
    """What holds of the model it leaves (besides computing the same, which validation checks)."""

    def ran(self, changed: int) -> Applied:
        """What one run did, for a report: 0 rewrites says the model is unchanged."""
        return {"pass": self.name, "changed": int(changed)}


Applied = TypedDict("Applied", {"pass": str, "changed": int})
"""One pass's run in a step's report: its name, and the rewrites it made (nodes fused, MatMuls
carried...); 0: the model was left as it was."""


def set_nodes(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto]) -> None:
    """``graph``'s node list replaced by ``nodes`` (copied in, so they may come from it)."""
    kept = [detached(n) for n in nodes]
    graph.ClearField("node")
    graph.node.extend(kept)


def replace_nodes(graph: onnx.GraphProto, rewritten: Mapping[int, Sequence[onnx.NodeProto]]) -> None:
    """Each node at a position in ``rewritten`` replaced by the nodes given for it, in place, the
    others kept in their order."""
    set_nodes(graph, [n for i, old in enumerate(graph.node) for n in rewritten.get(i, [old])])


def detached(node: onnx.NodeProto) -> onnx.NodeProto:
    """A detached copy of ``node``, to outlive its removal from the graph's node list."""
    out = type(node)()
    out.CopyFrom(node)
    return out


def live(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing reads any more (graph outputs are read),
    producers before users: the one dead-node removal."""
    made = {o: n for n in nodes for o in n.output if o}
    order: list[onnx.NodeProto] = []
    state: dict[int, bool] = {}  # False: being visited, True: placed
    for out in graph.output:
        if out.name not in made:
            continue
        stack = [(made[out.name], False)]
        while stack:
            node, ready = stack.pop()
            if ready:
                state[id(node)] = True
                order.append(node)
                continue
            if id(node) in state:
                continue
            state[id(node)] = False
            stack.append((node, True))
            stack.extend((made[i], False) for i in reversed(node.input) if i in made and id(made[i]) not in state)
    return order


def drop_unused(graph: onnx.GraphProto, names: set[str]) -> None:
    """Removes the initializers in ``names`` that no node (subgraphs included) or graph output
    reads any more, with their graph inputs and value infos."""
    used = {o.name for o in graph.output}

    def walk(g: onnx.GraphProto) -> None:
        for n in g.node:
            used.update(n.input)
            for a in n.attribute:
                for sub in [a.g] if a.HasField("g") else list(a.graphs):
                    walk(sub)

    walk(graph)
    gone = names - used
    for field_ in (graph.initializer, graph.input, graph.value_info):
        for item in [x for x in field_ if x.name in gone]:
            field_.remove(item)
