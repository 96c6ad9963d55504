"""Where a variant first goes wrong: its intermediate tensors beside its base's, node by node.

A quantized or optimized file that fails validation is run with every intermediate output
exposed, beside the file it was made from (``quantize.from``: model or optimized; the
export for ``optimized``). Tensors both graphs name alike are compared in the variant's
node order with the variant's tolerances; the first node whose output is outside them is
the answer, with the module it came from (the exporter's node name or metadata) and a
minimal model (``onnx.utils.extract_model``: that node alone, fed by its inputs) plus the
inputs that make it diverge, saved so the failure can be reproduced and reported without
the rest of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

    Values = dict[str, NDArray[np.generic]]

from onnxbuild._util import atol_scale_of
from onnxbuild.errors import StepError
from onnxbuild.runtimes import sessions

DIVERGENCE = "divergence"
"""The folder of a failed validate step's outputs that holds the diverging node's subgraph
(the engine keeps it beside the failed step's reports)."""


@dataclass(frozen=True)
class Divergence:
    """The first node of the candidate whose output leaves the tolerance."""

    node: str
    op_type: str
    output: str
    module: str
    """The source module the node came from, where the exporter kept it ("" otherwise)."""
    max_abs_diff: float
    mismatched: float
    """Fraction of the output's elements outside the tolerance."""
    compared: int
    """Tensors compared before (and with) this one."""
    subgraph: Path | None
    inputs: Path | None


@dataclass(frozen=True)
class Search:
    """What the search found: the first divergence (None when every shared tensor agrees)
    and how far the final outputs are apart."""

    divergence: Divergence | None
    compared: int
    outputs_max_abs_diff: float


def feeds_for(model_path: Path, sizes: dict[str, int], seed: int = 0, vocab: int | None = None) -> Values:
    """Inputs for every input of the file as validation makes them (``make_inputs``: the
    same seed and sizes give the same values, so a search reproduces a validation case):
    symbolic dimensions from ``sizes`` (an unknown one is 1, a past is empty), token ids
    below ``vocab``, masks of ones, positions counting on from the past, and a left-padded
    last row where ``sizes`` has ``left_padding``."""
    import onnxruntime as ort

    from onnxbuild.sources.torchmodel import make_inputs, session_specs

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    sizes = {"past_sequence": 0, **sizes}
    return make_inputs(session_specs(session.get_inputs(), sizes, fallback="float32"), sizes, seed=seed, vocab=vocab)


def first_divergence(
    reference: Path, candidate: Path, feeds: Values, rtol: float, atol: float, out_dir: Path
) -> Search:
    """Compare every tensor ``candidate`` and ``reference`` both name, in candidate order."""

    import numpy as np
    import onnx

    ref_model = onnx.load_model(str(reference))
    cand_model = onnx.load_model(str(candidate))
    ref_names = {o for n in ref_model.graph.node for o in n.output if o}
    cand_floats = _float_tensors(cand_model)
    shared = [o for n in cand_model.graph.node for o in n.output if o in ref_names and o in cand_floats]
    graph_outputs = [o.name for o in cand_model.graph.output]
    # the inputs of every node too: the extracted subgraph is fed from them
    tensors = _all_tensors(cand_model)  # once: it walks the whole graph
    needed = {i for n in cand_model.graph.node for i in n.input if i in cand_floats or i in tensors}
    got = _run_exposed(cand_model, sorted(set(shared) | needed | set(graph_outputs)), feeds)
    ref = _run_exposed(ref_model, sorted(set(shared) | {o.name for o in ref_model.graph.output}), feeds)
    outputs_diff = max(
        (
            float(np.max(np.abs(got[o].astype(np.float64) - ref[o].astype(np.float64))))
            for o in graph_outputs
            if o in ref and o in got and got[o].shape == ref[o].shape and got[o].size
        ),
        default=0.0,
    )
    compared = 0
    producer = {o: n for n in cand_model.graph.node for o in n.output}
    for name in shared:
        a, b = got.get(name), ref.get(name)
        if a is None or b is None or a.shape != b.shape or not a.size:
            continue
        compared += 1
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        magnitude = np.abs(b.astype(np.float64))
        # atol in units of the tensor's own range, as validation's compare() measures it
        scale = atol_scale_of(b[np.isfinite(b)]) if b.dtype.kind == "f" else 1.0
        bad = ~(diff <= atol * scale + rtol * magnitude)
        if not bad.any():
            continue
        node = producer[name]
        subgraph, inputs = _extract(
            candidate, cand_model, node, _cut(cand_model, node, set(shared) | set(feeds)), got, out_dir
        )
        return Search(
            Divergence(
                node.name,
                node.op_type,
                name,
                _module(node),
                float(np.max(np.where(np.isfinite(diff), diff, np.inf))),
                float(bad.mean()),
                compared,
                subgraph,
                inputs,
            ),
            compared,
            outputs_diff,
        )
    return Search(None, compared, outputs_diff)


def _all_tensors(model: onnx.ModelProto) -> set[str]:
    inits = {t.name for t in model.graph.initializer}
    return {i for n in model.graph.node for i in n.input if i and i not in inits} | {i.name for i in model.graph.input}


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a custom-domain op inference cannot follow: fall back to the declared ones
        inferred = model
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    known = [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    return {v.name for v in known if v.type.tensor_type.elem_type in floats}


def _run_exposed(model: onnx.ModelProto, names: list[str], feeds: Values) -> Values:
    """Every named tensor's value, the model changed only by listing them as outputs."""
    import onnx
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    produced = {o for n in exposed.graph.node for o in n.output}
    for name in names:
        if name not in have and name in produced:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )  # keep every tensor as the file names it
    options.log_severity_level = 3
    for key, value in sessions.config().items():  # as validation computes (u8u8 where u8s8 saturates)
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    accepted = {i.name for i in session.get_inputs()}
    outs = [o.name for o in session.get_outputs()]
    values = session.run(outs, {k: v for k, v in feeds.items() if k in accepted})
    return dict(zip(outs, values, strict=True)) | {k: v for k, v in feeds.items() if k in accepted}


def _module(node: onnx.NodeProto) -> str:
    """The source module path: the exporter's metadata where present, else the scope in the
    node's name (``/transformer/h.1/mlp/c_fc/MatMul`` -> ``transformer.h.1.mlp.c_fc``)."""
    for prop in node.metadata_props:
        if prop.key in ("pkg.torch.onnx.name_scopes", "namespace"):
            return str(prop.value)
    parts = [p for p in node.name.split("/") if p]
    return ".".join(parts[:-1])


def _cut(model: onnx.ModelProto, node: onnx.NodeProto, agreed: set[str]) -> list[str]:
    """Where the subgraph starts: walking back from ``node``, the nearest tensors that were
    compared and agreed (or are model inputs); so a wrong weight inside a quantized MatMul's
    chain of nodes is in the subgraph, not cut off."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    cut: list[str] = []
    seen: set[str] = set()
    todo = [i for i in node.input if i]
    while todo:
        name = todo.pop()
        if name in seen or name in inits:
            continue
        seen.add(name)
        if name in agreed or name not in producer:
            cut.append(name)
        else:
            todo.extend(i for i in producer[name].input if i)
    return sorted(cut)


def _extract(
    path: Path, model: onnx.ModelProto, node: onnx.NodeProto, inputs: list[str], values: Values, out_dir: Path
) -> tuple[Path | None, Path | None]:
    """The nodes between ``inputs`` and ``node``'s outputs as a model, and an .npz of those
    inputs' values in the failing run."""
    import numpy as np
    import onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in node.name or node.output[0]).strip("_") or "node"
    sub, data = out_dir / f"{stem}.onnx", out_dir / f"{stem}.inputs.npz"
    outputs = [o for o in node.output if o]
    try:
        try:
            onnx.utils.extract_model(str(path), str(sub), inputs, outputs, check_model=False)
        except ValueError:
            # shape inference stopped short of these tensors (ONNX's Attention on 3-D inputs, a
            # contrib op): declare them from the values of the failing run, then cut again
            typed = _typed(model, [*inputs, *outputs], values)
            onnx.save_model(typed, str(sub))
            onnx.utils.extract_model(str(sub), str(sub), inputs, outputs, check_model=False)
    except Exception as exc:  # a node inside a subgraph, or inputs extract_model cannot cut at
        raise StepError(
            f"first divergence at {node.name} ({node.op_type}), but its subgraph could not be extracted: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    # Any: savez's **kwds share their names with its allow_pickle: bool
    arrays: dict[str, Any] = {i: values[i] for i in inputs if i in values}
    np.savez(str(data), **arrays)
    return sub, data


def _typed(model: onnx.ModelProto, names: list[str], values: Values) -> onnx.ModelProto:
    """``model`` with a value_info for each of ``names`` that has a value and none declared."""
    import onnx
    from onnx import helper

    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    declared = {v.name for v in [*typed.graph.value_info, *typed.graph.input, *typed.graph.output]}
    for name in names:
        if name in values and name not in declared:
            value = values[name]
            typed.graph.value_info.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
            )
    return typed
