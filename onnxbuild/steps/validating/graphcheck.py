"""Is the graph right, apart from what quantization cost: a weight-only variant against PyTorch
running that variant's own weights.

A 4- or 8-bit variant differs from PyTorch's float model by its rounding, which on random
weights (near-flat logits) or at 1B and up hides a wrong graph inside int4's tolerances. Here
each MatMulNBits weight of the file is dequantized (quant/weightcheck.py's reading of its
blocks) and put into the PyTorch model in place of the float weight it came from, found by the
node's name (``/model/layers.0/self_attn/q_proj/MatMul``; the fused graph's ``attn/qkv_proj``
split back into q, k and v by their sizes). The file is then run with every MatMulNBits at
accuracy_level 0, ONNX Runtime's float compute on the same dequantized values, and must agree
with that model at the fp32 tolerances: a wrong node, packing, scale or weight in the wrong
place shows at any size and on any weights. What quantization cost is the variant's own
comparison with the float model, beside this one.

Not run (and said so in the report) where a quantized weight has no PyTorch weight by name,
or the file holds quantized ops other than MatMulNBits (dynamic int8, a quantized table),
whose float compute is not the dequantized weights'.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np
    import onnx
    import torch
    from numpy.typing import NDArray

    from onnxbuild.quant.weightcheck import Dequantized
    from onnxbuild.report.validation import OutputComparison

OTHER_QUANTIZED = frozenset(
    {
        "MatMulInteger",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "QuantizeLinear",
        "DequantizeLinear",
        "GatherBlockQuantized",
        "QLinearMatMul",
        "QGemm",
        "QAttention",
        "QMoE",
    }
)
"""Quantized ops whose accuracy_level-0 compute is not a float MatMul on dequantized weights."""


class GraphShape(TypedDict):
    shape: dict[str, int]
    passed: bool
    outputs: dict[str, OutputComparison]


class GraphCheck(TypedDict):
    """The report's ``graph_check``: ``passed`` None where it could not run (``note`` says why)."""

    passed: bool | None
    note: str
    matmuls: int
    rtol: float
    atol: float
    max_abs_diff: float | None
    shapes: list[GraphShape]


class _Target(TypedDict):
    """Where a dequantized weight's columns [start, stop) go: rows [start, stop) of ``param``
    (an nn.Linear's [out, in] weight), or columns of it where it is a Conv1D's [in, out]."""

    param: str
    start: int
    stop: int
    rows: int
    conv1d: bool
    whole: bool
    """The whole weight of one nn.Linear: its value is the dequantized weight itself."""


def skipped(note: str, rtol: float, atol: float) -> GraphCheck:
    return {"passed": None, "note": note, "matmuls": 0, "rtol": rtol, "atol": atol, "max_abs_diff": None, "shapes": []}


def replacements(
    model_file: Path, model: torch.nn.Module
) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor]], int, str]:
    """Each PyTorch parameter a MatMulNBits weight of ``model_file`` came from, as the function
    that makes its dequantized value (read when called, one quantized weight held at a time),
    and how many MatMulNBits there are; or no functions and why not."""
    from onnx import helper

    from onnxbuild.quant.aliases import weight_aliases
    from onnxbuild.quant.weightcheck import nbits, open_file

    file = open_file(model_file)
    graph = file.model.graph
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
    if not nodes:  # no weight-only MatMul (dynamic int8): its rounding is its comparison's business
        return {}, 0, ""
    others = sorted({n.op_type for n in graph.node if n.op_type in OTHER_QUANTIZED})
    if others:
        return (
            {},
            0,
            f"not run: the file holds {', '.join(others)}, whose float compute is not its dequantized weights'",
        )
    targets: dict[str, list[tuple[onnx.NodeProto, _Target]]] = {}
    values: dict[str, Dequantized] = {}  # each node's weight, dequantized when called
    unmapped: list[str] = []
    for node in nodes:
        sizes = {a.name: int(helper.get_attribute_value(a)) for a in node.attribute if a.name in ("K", "N")}
        weight = nbits(node, file)
        found = _targets(model, re.sub(r"_Q\d+$", "", node.name), sizes["K"], sizes["N"])
        if not found and weight is not None and weight[0].endswith(".weight"):
            # named after its parameter where the graph keeps torch's names (GPT-2's fused graph)
            found = _linear(model, weight[0][: -len(".weight")], sizes["K"], sizes["N"])
        if not found or weight is None:
            unmapped.append(node.name or node.output[0])
        else:
            values[node.name or node.output[0]] = weight[2]
        for t in found:
            parts = targets.setdefault(t["param"], [])
            twin = [n for n, u in parts if (u["start"], u["stop"]) == (t["start"], t["stop"])]
            if not twin:
                parts.append((node, t))
            elif twin[0].input[1:] != node.input[1:]:  # one parameter, two roundings: no one PyTorch weight
                unmapped.append(node.name or node.output[0])
    if unmapped:
        return (
            {},
            len(nodes),
            f"not run: {len(unmapped)} of {len(nodes)} quantized MatMuls have no PyTorch weight by their "
            f"node's name (first: {unmapped[0]})",
        )
    aliases = weight_aliases(graph)
    for node in graph.node:
        weight_name = aliases.get(node.input[1], node.input[1]) if node.op_type == "MatMul" else ""
        shape = tuple(file.tensors[weight_name].dims) if weight_name in file.tensors else ()
        if len(shape) == 2:
            both = [t["param"] for t in _targets(model, node.name, shape[0], shape[1]) if t["param"] in targets]
            if both:  # PyTorch has one value for it: the check would compare two weights against one
                return (
                    {},
                    len(nodes),
                    f"not run: {both[0]} is read by quantized MatMuls and by a float one ({node.name})",
                )
    held: dict[str, NDArray[np.float32]] = {}  # q, k and v's one weight, dequantized once for the three
    offsets = _split_offsets(graph, set(file.tensors))

    def dequantized(node: onnx.NodeProto, keep: bool = True) -> NDArray[np.float32]:
        import numpy as np

        key = node.name or node.output[0]
        if key not in held or not keep:
            held.clear()
            value = values[key]()
            assert value is not None
            weight = value[0]
            if node.output[0] in offsets:  # the split form's float part: one r per block and column
                r = file.array(offsets[node.output[0]]).astype(np.float32)
                block = -(-weight.shape[0] // r.shape[0])
                weight += np.repeat(r, block, axis=0)[: weight.shape[0]]
            if not keep:
                return weight
            held[key] = weight
        return held[key]

    def maker(parts: list[tuple[onnx.NodeProto, _Target]]) -> Callable[[torch.Tensor], torch.Tensor]:
        def make(old: torch.Tensor) -> torch.Tensor:
            import numpy as np
            import torch

            (node, first), *others = parts
            if not others and first["whole"]:
                # a whole nn.Linear weight: the dequantized [K, N] array's own [N, K] memory, not
                # a copy of it (a 3B model's 1.6 GB head held three times took validation to 5.2 GB)
                return torch.from_numpy(np.ascontiguousarray(dequantized(node, keep=False).T)).to(old.dtype)
            covered = sum(t["stop"] - t["start"] for _, t in parts) == first["rows"]
            new = torch.empty(old.shape, dtype=old.dtype) if covered else old.detach().to("cpu", copy=True)
            at = 0
            for node, t in parts:
                block = torch.from_numpy(dequantized(node)[:, t["start"] : t["stop"]]).to(new.dtype)
                size = t["stop"] - t["start"]
                if t["conv1d"]:
                    new[:, at : at + size] = block
                else:
                    new[at : at + size] = block.T
                at += size
            return new

        return make

    return {param: maker(parts) for param, parts in targets.items()}, len(nodes), ""


def _split_offsets(graph: onnx.GraphProto, constants: set[str]) -> dict[str, str]:
    """MatMulNBits outputs in the split form (quant/gguf_exact.split_matmul_nbits: HQQ's float
    zero points, GGUF's Q4_1 minimums): ``codes + block_sums(a) @ r`` where an Add reads the
    output and a MatMul of a constant [k_blocks, N] ``r``: the output's ``r``."""
    producer = {o: n for n in graph.node for o in n.output}
    out: dict[str, str] = {}
    for add in graph.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        for mine, other in (add.input, reversed(add.input)):
            offset = producer.get(other)
            codes = producer.get(mine)
            if (
                codes is not None
                and codes.op_type == "MatMulNBits"
                and offset is not None
                and offset.op_type == "MatMul"
                and offset.input[1] in constants
            ):
                out[mine] = offset.input[1]
    return out


def _targets(model: torch.nn.Module, name: str, k: int, n: int) -> list[_Target]:
    """Where a MatMul named ``name`` (a traced export's ``/model/model/layers.0/self_attn/q_proj/MatMul``,
    the fused graph's ``/model/layers.0/attn/qkv_proj/MatMul``) with a [k, n] weight came from."""
    import torch

    path = name.strip("/").rsplit("/", 1)[0].replace("/", ".")
    # a traced export's names start with the wrapper's own attribute (``/model/model/layers.0``)
    bare = path.split(".", 1)[1] if path.startswith("model.") else path
    # a module called again (ALBERT's shared layer) is ``query_1`` at its second call
    again = re.sub(r"_\d+(?=\.|$)", "", bare)
    for candidate in dict.fromkeys((path, path.replace(".attn.", ".self_attn."), bare, again)):
        linear = _linear(model, candidate, k, n)
        if linear:
            return linear
        parent, _, leaf = candidate.rpartition(".")
        owner = _module(model, parent)
        if owner is None:
            continue
        found = {p: getattr(_module(owner, p), "weight", None) for p in ("q_proj", "k_proj", "v_proj")}
        parts = {p: w for p, w in found.items() if isinstance(w, torch.Tensor)}
        if leaf == "qkv_proj" and len(parts) == 3:
            out: list[_Target] = []
            start = 0
            for p, part in parts.items():
                rows = int(part.shape[0])
                out.append(
                    {
                        "param": f"{parent}.{p}.weight",
                        "start": start,
                        "stop": start + rows,
                        "rows": rows,
                        "conv1d": False,
                        "whole": False,
                    }
                )
                start += rows
            if start == n:
                return out
    return []


def _linear(model: torch.nn.Module, path: str, k: int, n: int) -> list[_Target]:
    """The weight of the module at ``path`` where it is a [k, n] MatMul's: an nn.Linear's
    [n, k], or GPT-2's Conv1D's [k, n] as it is."""
    module = _module(model, path)
    weight = getattr(module, "weight", None)
    if weight is None or weight.ndim != 2:
        return []
    shape = tuple(weight.shape)
    if type(module).__name__ == "Conv1D" and shape == (k, n):
        return [{"param": f"{path}.weight", "start": 0, "stop": n, "rows": n, "conv1d": True, "whole": False}]
    if shape == (n, k):
        return [{"param": f"{path}.weight", "start": 0, "stop": n, "rows": n, "conv1d": False, "whole": True}]
    return []


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        return None


def float_compute(model_file: Path) -> onnx.ModelProto:
    """The file's graph (weights left where they are) with every MatMulNBits at accuracy_level 0."""
    import onnx

    model = onnx.load_model(str(model_file), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend(kept)
    return model


def compared(
    model_file: Path,
    cases: Sequence[tuple[dict[str, int], dict[str, NDArray[np.generic]], Callable[..., NDArray[np.generic]]]],
    references: Sequence[Sequence[NDArray[np.generic]]],
    outputs: list[str],
    matmuls: int,
    rtol: float,
    atol: float,
) -> GraphCheck:
    """The file at float compute against ``references`` (PyTorch on its dequantized weights) at
    each case: ``(sizes, feeds, keep)``, ``keep`` cutting an output to its real tokens."""
    import numpy as np
    import onnxruntime as ort

    from onnxbuild.runtimes import sessions
    from onnxbuild.steps.validating.compare import as_declared, compare

    options = sessions.options()
    # the graph from memory, its external data from the file's folder: nothing is written
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_file.parent))
    session = ort.InferenceSession(
        float_compute(model_file).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    shapes: list[GraphShape] = []
    for (sizes, feeds, keep), reference in zip(cases, references, strict=True):
        got = session.run(outputs, as_declared(session, feeds))
        compared_outputs = {
            name: compare(ref, np.asarray(keep(name, g)), rtol, atol)
            for name, ref, g in zip(outputs, reference, got, strict=False)
        }
        passed = all(c["passed"] for c in compared_outputs.values())
        shapes.append({"shape": dict(sizes), "passed": passed, "outputs": compared_outputs})
    worst = max((c["max_abs_diff"] or 0.0 for s in shapes for c in s["outputs"].values()), default=None)
    passed = all(s["passed"] for s in shapes)
    note = (
        f"{matmuls} quantized MatMuls at float compute against PyTorch on the same dequantized weights: "
        f"{'agree' if passed else 'DISAGREE'} at the fp32 tolerances (rtol {rtol:g}, atol {atol:g}), "
        f"max abs diff {worst:.2e}"
    )
    return {
        "passed": passed,
        "note": note,
        "matmuls": matmuls,
        "rtol": rtol,
        "atol": atol,
        "max_abs_diff": worst,
        "shapes": shapes,
    }
