"""Build an ONNX model from the recipe's declarative ``graph:`` section with onnx.helper."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import Tensor
from onnxbuild.sources.kind import Defaults, GraphSource, GraphValue, NestedValues, Problem, SourceKind

if TYPE_CHECKING:
    import onnx

DTYPES = {
    "float32": "FLOAT",
    "float16": "FLOAT16",
    "bfloat16": "BFLOAT16",
    "float64": "DOUBLE",
    "int8": "INT8",
    "uint8": "UINT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "bool": "BOOL",
}


def build_graph_model(spec: GraphSource) -> onnx.ModelProto:
    """Return an ``onnx.ModelProto`` for a resolved ``source.graph`` section.

    Random initializers use numpy's PCG64 generator seeded per tensor, so the
    model's bytes depend only on the recipe.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    def elem(dtype: str) -> int:
        return int(getattr(onnx.TensorProto, DTYPES[dtype]))

    def value_info(v: GraphValue) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(v["name"], elem(v["dtype"]), list(v["shape"]))

    initializers = []
    for init in spec["initializers"]:
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(elem(init["dtype"]))
        shape = tuple(init["shape"])
        if "values" in init:
            array = np.asarray(init["values"], dtype=np_dtype).reshape(shape)
        else:
            rnd = init["random"]
            rng = np.random.default_rng(rnd["seed"])
            if rnd["distribution"] == "normal":
                array = rng.standard_normal(shape) * rnd["scale"]
            else:
                array = rng.uniform(-rnd["scale"], rnd["scale"], shape)
            array = array.astype(np_dtype)
        initializers.append(numpy_helper.from_array(array, init["name"]))

    nodes = []
    for i, n in enumerate(spec["nodes"]):
        try:
            nodes.append(
                helper.make_node(
                    n["op_type"],
                    n["inputs"],
                    n["outputs"],
                    name=n.get("name") or f"{n['op_type']}_{i}",
                    domain=n["domain"] or None,
                    **n["attributes"],
                )
            )
        except (ValueError, TypeError) as exc:
            raise StepError(f"source.graph.nodes[{i}] ({n['op_type']}): cannot build the node: {exc}") from None
    graph = helper.make_graph(
        nodes,
        spec["name"],
        [value_info(v) for v in spec["inputs"]],
        [value_info(v) for v in spec["outputs"]],
        initializer=initializers,
        doc_string=spec["doc_string"] or None,
    )
    opsets = [helper.make_opsetid("", spec["opset"])]
    opsets += [helper.make_opsetid(domain, version) for domain, version in sorted(spec["extra_opsets"].items())]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=spec["ir_version"], producer_name="onnxbuild")
    return model


def identity(src: GraphSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """Nothing outside the recipe: the graph section itself is in the key."""
    return {}, {}


def estimate_weights(src: GraphSource, recipe_dir: Path) -> int:
    return 64 * 1024 * 1024


def resolve(src: dict[str, Any], defaults: Defaults) -> None:
    """Each initializer and node with its schema defaults (the schema's own defaults stop
    at the first level of a list)."""
    src["initializers"] = [defaults(i, "#/$defs/initializer") for i in src["initializers"]]
    for init in src["initializers"]:
        if "random" in init:
            init["random"] = defaults(init["random"], "#/$defs/initializer/properties/random")
    src["nodes"] = [defaults(n, "#/$defs/node") for n in src["nodes"]]


def check(src: GraphSource, doc: Mapping[str, object]) -> Iterable[Problem]:
    """Every name a node reads is defined earlier; values fill their shapes; outputs are produced."""
    defined: set[str] = set()
    for value in src["inputs"]:
        defined.add(value["name"])
    for i, init in enumerate(src.get("initializers", [])):
        has_values, has_random = "values" in init, "random" in init
        if has_values == has_random:
            got = "it has both" if has_values else "it has neither"
            yield (
                ("source", "graph", "initializers", i),
                f"give exactly one of `values` (the numbers) and `random` (a seed); {got}",
                True,
            )
        if has_values:
            count = _count_leaves(init["values"])
            want = 1
            for d in init["shape"]:
                want *= d
            if count != want:
                yield (
                    ("source", "graph", "initializers", i, "values"),
                    f"has {count} values but shape {init['shape']} needs {want}",
                    False,
                )
        defined.add(init["name"])
    for i, node in enumerate(src["nodes"]):
        for j, name in enumerate(node["inputs"]):
            if name and name not in defined:
                yield (
                    ("source", "graph", "nodes", i, "inputs", j),
                    f"{name!r} is not a graph input, an initializer or the output of an earlier node",
                    False,
                )
        defined.update(node["outputs"])
    for i, value in enumerate(src["outputs"]):
        if value["name"] not in defined:
            yield ("source", "graph", "outputs", i, "name"), f"{value['name']!r} is not produced by any node", False


def benchmark_inputs(src: GraphSource) -> list[Tensor]:
    """The inputs whose symbolic dimensions a benchmark sizes (at 1 unless the recipe says)."""
    return [Tensor(name=v["name"], dtype=v["dtype"], shape=v["shape"]) for v in src.get("inputs", [])]


def _count_leaves(values: NestedValues | float) -> int:
    if isinstance(values, list):
        return sum(_count_leaves(v) for v in values)
    return 1


KIND = SourceKind(
    name="graph",
    traced=False,
    identity=identity,
    estimate_weights=estimate_weights,
    resolve=resolve,
    check=check,
    benchmark_inputs=benchmark_inputs,
    build_onnx=build_graph_model,
)
"""What this kind says of itself (onnxbuild.sources.kind.SourceKind)."""
