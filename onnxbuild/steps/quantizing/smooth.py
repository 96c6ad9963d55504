"""``smooth_int8``: 8-bit activations on a decoder that keep its quality (issue 52).

onnxruntime's dynamic int8 gives each activation tensor one uint8 scale, and an LLM's few
outlier channels (SmolLM2's reach 100x the others) take all of it: +64% perplexity. So:

1. **SmoothQuant.** Each MatMul input ``x`` is divided per channel by ``s`` and the weights it
   feeds multiplied by ``s`` (``x W = (x / s)(s W)``), with ``s = amax^a / wmax^(1-a)`` from the
   channel's largest activation on the calibration text and its largest weight. ``a`` is chosen
   per layer input from ALPHAS by the error of the layer simulated at int8 (uint8 per-tensor
   activations, int8 per-column weights, as onnxruntime computes it) on the calibration rows.
   ``1/s`` goes into what makes ``x``, so the graph gains no op: a norm's weight (q/k/v,
   gate/up, lm_head) or up_proj's columns (down_proj: its input is ``silu(gate) * up``). Any
   other input (o_proj's: folding into v's columns would scale the KV cache a file hands to
   another in a served pair) gets a Mul by 1/s, an elementwise op beside a MatMul.
2. **Mixed precision.** The MatMuls named in ``keep`` and those of the ``keep_worst`` layer
   inputs with the largest simulated error stay at 8-bit weight-only (MatMulNBits, float
   activations quantized per block at accuracy_level 4: the kernel that keeps +0.4% at 8 bits).
3. onnxruntime's ``quantize_dynamic`` (per-channel int8 weights) on the rest.

Measured on SmolLM2-135M (recipes/smollm2-135m.yaml's int8-smooth, held-out text): keep
down_proj (its input's outliers are whole tokens, which no per-channel s moves) and keep_worst
10: +0.86% perplexity, KL 0.0068, 128-token prefill about half fp32's; plain dynamic int8 +64%,
smoothed with nothing kept +6%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from onnxbuild._util import pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.runtimes.sessions import Session
from onnxbuild.steps.base import StepContext, StepSpec
from onnxbuild.steps.quantizing.int8 import excluded

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

ALPHAS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
"""The migration strengths tried per layer input (0: not smoothed)."""
ROWS = 128
"""Calibration rows per window each layer's error is simulated on: one prefill's worth, whose
one activation scale covers them."""
NORMS = {
    "SimplifiedLayerNormalization": (1, None),
    "SkipSimplifiedLayerNormalization": (2, None),
    "RMSNormalization": (1, None),
    "LayerNormalization": (1, 2),
    "SkipLayerNormalization": (2, 3),
}
"""Norm op -> the inputs holding its weight and bias (output 0 is the only one they scale)."""


class SmoothGroup(TypedDict):
    """One layer input: the MatMuls it feeds, its alpha and where 1/s went."""

    matmuls: list[str]
    alpha: float
    folded: str
    """"norm" (the norm's weight), "up" (a gated MLP's up_proj columns), "mul" (a Mul by 1/s
    inserted before the MatMuls) or "not smoothed: <why>"."""
    error: float
    """Its simulated int8 error at that alpha, relative to the float output's."""


class SmoothPlan(TypedDict):
    """reports/quantize/<name>.json of a smooth_int8 entry; its alphas and kept MatMuls are in the lock."""

    calibration: str
    groups: list[SmoothGroup]
    kept: list[str]
    """MatMuls at 8-bit weight-only: keep's, then the keep_worst groups'."""
    dynamic: int
    """MatMuls at dynamic int8."""


@dataclass(frozen=True)
class _Fold:
    """Where a layer input's 1/s goes: ``how`` is "norm" (its weight, ``tensor``, and bias), "up"
    (the columns of ``tensor``) or "mul" (a Mul by 1/s inserted before the MatMuls)."""

    how: str
    tensor: str
    bias: str | None = None


def smooth_int8(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> SmoothPlan:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from onnxbuild.quant.aliases import fold_weight_aliases
    from onnxbuild.steps.quantizing.budgeted import calibration_windows, prefill_feeds

    if src.with_name(f"{src.name}.data").is_file():
        raise StepError(
            f"quantize.{q['name']}: smooth_int8 holds the whole graph in memory and this file's weights are "
            "over 2 GB (external data); use method: weight_only (bits: 8) for a model this size"
        )
    model = onnx.load_model(str(src))
    fold_weight_aliases(model)
    left_float = set(excluded(model, {**q, "keep": []}))  # exclude_nodes and attention: float
    keep = set(excluded(model, {**q, "exclude_nodes": []})) - left_float
    where = ""

    def feeds(session: Session) -> list[dict[str, NDArray[np.generic]]]:
        nonlocal where
        windows, where = calibration_windows(ctx, spec, q, session)
        return [prefill_feeds(session, window) for window in windows]

    plan = smoothed(model, feeds, left_float)
    graph = model.graph
    ranked = sorted((g for g in plan if not keep.intersection(g["matmuls"])), key=lambda g: -g["error"])
    worst = {m for g in ranked[: q["keep_worst"]] for m in g["matmuls"]}
    kept = [n.name for n in graph.node if n.name in keep or n.name in worst]
    scratch = out.with_name("smoothed-dynamic.onnx")
    quantize_dynamic(
        model,
        str(scratch),
        per_channel=True,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=[*left_float, *kept] or None,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    del model
    mixed = onnx.load_model(str(scratch))
    scratch.unlink()
    if kept:
        quantizer = MatMulNBitsQuantizer(
            mixed,
            bits=8,
            block_size=q["block_size"],
            is_symmetric=False,
            accuracy_level=q["accuracy_level"] or None,
            nodes_to_include=kept,
        )
        quantizer.process()
        mixed = quantizer.model.model
    onnx.save_model(mixed, str(out))
    dynamic = sum(1 for n in mixed.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul"))
    result: SmoothPlan = {"calibration": where, "groups": plan, "kept": kept, "dynamic": dynamic}
    ctx.output(f"reports/quantize/{q['name']}.json").write_text(pretty_json(result), encoding="utf-8")
    return result


def smoothed(
    model: onnx.ModelProto, feeds: Callable[[Session], list[dict[str, NDArray[np.generic]]]], left_float: set[str]
) -> list[SmoothGroup]:
    """SmoothQuant folded into ``model`` in place, calibrated by running the feeds ``feeds`` makes
    for the model's session: each layer input's plan. MatMuls named in ``left_float`` are not
    touched."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    groups: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        weighted = n.op_type == "MatMul" and n.input[1] in weights and len(weights[n.input[1]].dims) == 2
        if weighted and n.name not in left_float:
            groups.setdefault(n.input[0], []).append(n)
    # every layer input as an output of the model itself for one session, then taken off again:
    # a copy of the model to probe would hold its weights twice
    outputs = len(graph.output)
    graph.output.extend(onnx.helper.make_tensor_value_info(a, onnx.TensorProto.FLOAT, None) for a in groups)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    del graph.output[outputs:]
    names = list(groups)
    amax: dict[str, NDArray[np.float32]] = {}
    rows: dict[str, list[NDArray[np.float32]]] = {a: [] for a in names}
    for feed in feeds(session):
        for a, x in zip(names, session.run(names, feed), strict=True):
            x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
            amax[a] = np.maximum(amax[a], np.abs(x).max(0)) if a in amax else np.abs(x).max(0)
            rows[a].append(x[:ROWS])
    del session
    producer = {o: n for n in graph.node for o in n.output}
    uses: dict[str, int] = {}
    for n in graph.node:
        for name in n.input:
            uses[name] = uses.get(name, 0) + 1
    for o in graph.output:
        uses[o.name] = uses.get(o.name, 0) + 1
    arrays: dict[str, NDArray[np.float32]] = {}  # every weight as smoothed so far, by name

    def array(name: str) -> NDArray[np.float32]:
        if name not in arrays:
            arrays[name] = numpy_helper.to_array(weights[name]).astype(np.float32)
        return arrays[name]

    plan: list[SmoothGroup] = []
    inserted: list[tuple[str, onnx.NodeProto]] = []
    # in graph order: up_proj's rows are scaled for its own input before down_proj's 1/s goes into its columns
    for a, mms in groups.items():
        fold = _fold_site(a, mms, weights, producer, uses)
        ws = [array(n.input[1]) for n in mms]
        if isinstance(fold, str):
            alpha, s, err = _best_alpha(rows[a], ws, amax[a], smooth=False)
            plan.append({"matmuls": [n.name for n in mms], "alpha": 0.0, "folded": fold, "error": round(err, 6)})
            continue
        alpha, s, err = _best_alpha(rows[a], ws, amax[a], smooth=True)
        folded = fold.how if alpha else "not smoothed: alpha 0 rounds best"
        plan.append({"matmuls": [n.name for n in mms], "alpha": alpha, "folded": folded, "error": round(err, 6)})
        if not alpha:
            continue
        for n in mms:
            arrays[n.input[1]] = arrays[n.input[1]] * s[:, None]
        inverse = (1.0 / s).astype(np.float32)
        if fold.how == "mul":
            scaled = f"{a}/smoothed"
            graph.initializer.append(numpy_helper.from_array(inverse, f"{a}/inverse_s"))
            inserted.append(
                (
                    mms[0].name,
                    onnx.helper.make_node("Mul", [a, f"{a}/inverse_s"], [scaled], name=f"{mms[0].name}/smooth"),
                )
            )
            for n in mms:
                n.input[0] = scaled
        elif fold.how == "norm":
            arrays[fold.tensor] = array(fold.tensor) * inverse
            if fold.bias is not None:  # LayerNorm's output is x_hat * weight + bias: both scale
                arrays[fold.bias] = array(fold.bias) * inverse
        else:
            arrays[fold.tensor] = array(fold.tensor) * inverse[None, :]
    for before, mul in inserted:  # each Mul just before the first MatMul it feeds: the graph stays in order
        at = next(i for i, n in enumerate(graph.node) if n.name == before)
        graph.node.insert(at, mul)
    renamed = {name: f"{name}.smoothed" for name in arrays}
    for name, value in arrays.items():
        # a new name: the weights check compares a quantized weight with the float weight of its
        # name in the file it came from, which is not the smoothed one
        weights[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), renamed[name]))
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name in renamed:
                n.input[i] = renamed[name]
    arrays.clear()  # the smoothed weights are in the graph now
    rows.clear()
    return plan


def _fold_site(
    x: str,
    mms: list[onnx.NodeProto],
    weights: dict[str, onnx.TensorProto],
    producer: dict[str, onnx.NodeProto],
    uses: dict[str, int],
) -> _Fold | str:
    """Where ``x``'s 1/s can go with the graph unchanged, else a Mul by 1/s before the MatMuls
    (o_proj: folding into v's columns would scale the KV cache the file hands to another), or
    why not at all."""
    if any(uses[n.input[1]] != 1 for n in mms):  # a tied embedding's table: the Gather reads it too
        return "not smoothed: a weight read elsewhere too"
    made = producer.get(x)
    k = int(weights[mms[0].input[1]].dims[0])
    if made is not None and uses.get(x, 0) == len(mms):
        if made.op_type in NORMS and made.output[0] == x:
            at, bias_at = NORMS[made.op_type]
            w = made.input[at]
            b = made.input[bias_at] if bias_at is not None and len(made.input) > bias_at else ""
            bias_ok = not b or (b in weights and uses[b] == 1 and tuple(weights[b].dims) == (k,))
            if w in weights and uses[w] == 1 and tuple(weights[w].dims) == (k,) and bias_ok:
                return _Fold("norm", w, b or None)
        if made.op_type == "Mul":  # a gated MLP's silu(gate) * up: up's columns carry it
            for name in made.input:
                up = producer.get(name)
                if up is None or up.op_type != "MatMul" or uses[name] != 1:
                    continue
                if up.input[1] in weights and uses[up.input[1]] == 1 and weights[up.input[1]].dims[1] == k:
                    return _Fold("up", up.input[1])
    return _Fold("mul", "")


def _best_alpha(
    rows: list[NDArray[np.float32]],
    ws: list[NDArray[np.float32]],
    amax: NDArray[np.float32],
    *,
    smooth: bool,
) -> tuple[float, NDArray[np.float32], float]:
    """The alpha of ALPHAS whose s rounds this layer input's MatMuls best at int8, that s and
    the error, relative to the float outputs' energy."""
    import numpy as np

    am = np.maximum(amax, 1e-5)
    wm = np.maximum(np.max([np.abs(w).max(1) for w in ws], 0), 1e-5)
    exact = [x @ w for x in rows for w in ws]
    energy = sum(float(np.square(y).sum()) for y in exact) or 1.0
    best: tuple[float, float, NDArray[np.float32]] | None = None
    for alpha in ALPHAS if smooth else (0.0,):
        s = (am**alpha / wm ** (1 - alpha)) if alpha else np.ones_like(am)
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        quantized = [_q_weight(w * s[:, None]) for w in ws]
        err = 0.0
        i = 0
        for x in rows:
            qx = _q_act(x / s)
            for qw in quantized:
                err += float(np.square(qx @ qw - exact[i]).sum())
                i += 1
        if best is None or err < best[0]:
            best = (err, alpha, s)
    assert best is not None
    return best[1], best[2], best[0] / energy


def _q_act(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """DynamicQuantizeLinear's rounding: uint8, asymmetric, one scale for the tensor."""
    import numpy as np

    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255 or 1.0
    zero = np.clip(np.round(-lo / scale), 0, 255)
    out: NDArray[np.float32] = ((np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)
    return out


def _q_weight(w: NDArray[np.float32]) -> NDArray[np.float32]:
    """Symmetric int8, one scale per output column (quantize_dynamic's per_channel)."""
    import numpy as np

    s = np.abs(w).max(0, keepdims=True) / 127
    s[s == 0] = 1
    out: NDArray[np.float32] = np.round(w / s) * s
    return out
