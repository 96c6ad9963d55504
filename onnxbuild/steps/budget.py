"""An accuracy budget for a weight-only quantize entry: which MatMuls to keep at higher
precision so the file stays within ``budget`` of the float model, at the least cost in bytes.

``quantize: [{name: int4, method: int4, budget: {ppl_increase_max: 0.05}}]`` plans per layer:

1. **Sensitivity.** The float file runs the calibration windows once with every MatMul's
   input exposed; each MatMul's weight is rounded to the method's grid (round-to-nearest, in
   numpy) and its sensitivity is the relative error that rounding puts into its output on
   those activations, ``|X (W - Q(W))|^2 / |X W|^2``. One pass of the model, not one per
   layer: a 30-layer model has 151 MatMuls.
2. **Order.** Each MatMul's worth is its sensitivity per byte that keeping it costs (the
   fallback's bytes less the method's), highest first; ties by name, so the same inputs give
   the same plan.
3. **Search.** Keeping the first ``k`` in that order at the fallback (8 bits, or float), the
   least ``k`` whose file meets the budget on the calibration windows, measured against the
   float file's logits: k = 0, then 1, 2, 4, ... until one meets it, then bisection between
   the last that failed and the first that met it (the figure falls as k grows, nearly always;
   the plan is the least k found this way).

The plan (each kept MatMul, its sensitivity and bits, and the figure it reached) goes into
reports/quantize/<name>.json, the step's data and the lock file, so a review shows which
layers changed precision. A budget no plan meets, every MatMul kept, is an error that names
the best plan's figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from onnxbuild.errors import StepError

METRICS = ("ppl_increase_max", "kld_max")


class KeptLayer(TypedDict):
    node: str
    bits: int | None
    """The fallback: 8, or None for float."""
    sensitivity: float


class PrecisionPlan(TypedDict):
    """What the budget chose, as reports/quantize/<name>.json and the lock record it."""

    budget: dict[str, float]
    calibration: str
    matmuls: int
    bits: int
    kept: list[KeptLayer]
    figures: dict[str, float]
    """The chosen file's ppl_increase and kld_mean on the calibration windows."""
    tried: list[dict[str, Any]]
    """Each k tried and its figures, in order: how the plan was found."""


@dataclass(frozen=True)
class Candidate:
    node: str
    weight: str
    sensitivity: float
    extra_bytes: int


def quantized_copy(weight: Any, bits: int, block: int, symmetric: bool) -> Any:
    """``weight`` ([K, N], blocks along K) rounded to a ``bits``-bit grid per block, as the
    round-to-nearest quantizer rounds it (min/max, or max |w| when symmetric)."""
    import numpy as np

    k, n = weight.shape
    pad = (-k) % block
    w = np.concatenate([weight, np.zeros((pad, n), weight.dtype)]) if pad else weight
    blocks = w.reshape(-1, block, n).astype(np.float64)
    levels = 2**bits - 1
    if symmetric:
        scale = np.abs(blocks).max(axis=1, keepdims=True) / (levels // 2 + 0.5)
        scale[scale == 0] = 1.0
        q = np.clip(np.round(blocks / scale), -(levels // 2) - 1, levels // 2)
        out = q * scale
    else:
        lo, hi = np.minimum(blocks.min(axis=1, keepdims=True), 0), np.maximum(blocks.max(axis=1, keepdims=True), 0)
        scale = (hi - lo) / levels
        scale[scale == 0] = 1.0
        zero = np.round(-lo / scale)
        out = (np.clip(np.round(blocks / scale) + zero, 0, levels) - zero) * scale
    return out.reshape(-1, n)[:k].astype(weight.dtype)


def candidates(model: Any, feeds: list[dict[str, Any]], names: list[str], bits: int, block: int, symmetric: bool, fallback: int | None) -> list[Candidate]:
    """The MatMuls named in ``names`` (weights in initializers), each with its sensitivity on
    the activations ``feeds`` give it, best worth first."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.name in names and n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for n in nodes:
        if n.input[0] not in known:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(n.input[0]))
            known.add(n.input[0])
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = list(dict.fromkeys(n.input[0] for n in nodes))
    acts: dict[str, list[Any]] = {name: [] for name in wanted}
    for feed in feeds:
        for name, value in zip(wanted, session.run(wanted, feed), strict=True):
            acts[name].append(np.asarray(value).reshape(-1, np.shape(value)[-1]))
    del session
    out = []
    for n in nodes:
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        x = np.concatenate(acts[n.input[0]]).astype(np.float32)
        exact = x @ w
        err = x @ (w - quantized_copy(w, bits, block, symmetric))
        sensitivity = float((err.astype(np.float64) ** 2).sum() / max(float((exact.astype(np.float64) ** 2).sum()), 1e-30))
        kept_bytes = w.size * (4 if fallback is None else fallback / 8)
        out.append(Candidate(n.name, n.input[1], sensitivity, int(kept_bytes - w.size * bits / 8)))
    return sorted(out, key=lambda c: (-c.sensitivity / max(c.extra_bytes, 1), c.node))


def figures(reference: list[Any], logits: list[Any], targets: list[Any]) -> dict[str, float]:
    """ppl_increase and kld_mean of ``logits`` against the float file's ``reference`` (both
    lists of [positions, vocab]), predicting ``targets``."""
    from onnxbuild.steps.text_quality import Tally

    tally = Tally()
    for ref, got, tgt in zip(reference, logits, targets, strict=True):
        tally.add(ref, got, tgt)
    return {"ppl_increase": math.exp((tally.nll - tally.nll_reference) / tally.count) - 1.0, "kld_mean": max(0.0, tally.kl / tally.count)}


def meets(found: dict[str, float], budget: dict[str, float]) -> bool:
    return ("ppl_increase_max" not in budget or found["ppl_increase"] <= budget["ppl_increase_max"]) and ("kld_max" not in budget or found["kld_mean"] <= budget["kld_max"])


def search(order: list[Candidate], evaluate: Callable[[int], dict[str, float]], budget: dict[str, float], what: str) -> tuple[int, dict[str, float], list[dict[str, Any]]]:
    """The least k (keeping ``order[:k]``) whose figures meet ``budget``: 0, 1, 2, 4, ... then
    bisection. Raises a StepError naming the best plan when even every MatMul kept fails."""
    tried: list[dict[str, Any]] = []
    seen: dict[int, dict[str, float]] = {}

    def at(k: int) -> dict[str, float]:
        if k not in seen:
            seen[k] = evaluate(k)
            tried.append({"kept": k, **{key: round(v, 6) for key, v in seen[k].items()}})
        return seen[k]

    low, high = -1, None  # the largest k known to fail, the least known to meet
    k = 0
    while high is None:
        if meets(at(k), budget):
            high = k
        else:
            low = k
            if k == len(order):
                best = min(seen, key=lambda i: (seen[i]["ppl_increase"], i))
                shown = ", ".join(f"{key} {value:.4g}" for key, value in seen[best].items())
                wanted = ", ".join(f"{key} {value:g}" for key, value in budget.items())
                raise StepError(
                    f"{what}.budget: no plan meets {wanted} on the calibration text: the best found keeps {best} of {len(order)} MatMuls "
                    f"at the fallback precision and reaches {shown}; raise the budget, set budget.fallback: float, or use more bits"
                )
            k = min(len(order), max(1, 2 * k))
    while high - low > 1:
        mid = (low + high) // 2
        if meets(at(mid), budget):
            high = mid
        else:
            low = mid
    return high, seen[high], tried
