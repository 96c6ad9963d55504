"""An accuracy budget for a weight-only quantize entry: which MatMuls to keep at higher
precision so the file stays within ``budget`` of the float model, at the least cost in bytes.

``quantize: [{name: int4, method: int4, budget: {ppl_increase_max: 0.05}}]`` plans per layer:

1. **Sensitivity.** Each MatMul's weight alone is rounded to the method's grid
   (round-to-nearest, in numpy) and the model's next-token distribution on the first
   calibration window is compared with the float model's: the mean KL divergence is that
   MatMul's sensitivity. The weights are fed as inputs of one session, so this is one run per
   MatMul (151 for a 30-layer model), not one model build.
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
from typing import TYPE_CHECKING, TypedDict

from onnxbuild.errors import StepError

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray

METRICS = ("ppl_increase_max", "kld_max")


class KeptLayer(TypedDict):
    node: str
    bits: int | None
    """The fallback: 8, or None for float."""
    sensitivity: float


class PrecisionPlan(TypedDict):
    """What the budget chose, as reports/quantize/<name>.json and the lock record it."""

    budget: dict[str, float]
    margin: float
    """The plan meets budget x margin on the calibration text."""
    calibration: str
    matmuls: int
    bits: int
    kept: list[KeptLayer]
    figures: dict[str, float]
    """The chosen file's ppl_increase and kld_mean on the calibration windows."""
    tried: list[dict[str, float]]
    """Each k tried and its figures, in order: how the plan was found."""


@dataclass(frozen=True)
class Candidate:
    node: str
    weight: str
    sensitivity: float
    extra_bytes: int


def quantized_copy(weight: NDArray[np.float32], bits: int, block: int, symmetric: bool) -> NDArray[np.float32]:
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
    rounded: NDArray[np.float32] = out.reshape(-1, n)[:k].astype(weight.dtype)
    return rounded


def candidates(
    model: onnx.ModelProto,
    feeds: list[dict[str, NDArray[np.generic]]],
    names: list[str],
    bits: int,
    block: int,
    symmetric: bool,
    fallback: int | None,
) -> list[Candidate]:
    """The MatMuls named in ``names`` (weights in initializers), each with its measured
    sensitivity, best worth (sensitivity per byte kept) first.

    A MatMul's sensitivity is the mean KL divergence of the model's next-token distribution
    from the float model's when that MatMul alone is rounded to ``bits`` (in float, on the
    grid the quantizer uses), on the first calibration window. Measured, not estimated from
    the layer's own output error: on SmolLM2-135M every MatMul's relative output error at 4 bits
    is 0.3-1.2%, yet lm_head alone is most of the loss (+8% of the +34% perplexity), which only
    the logits show. The weights become graph inputs, so one session serves every trial: one
    run per MatMul, not one model build."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes = [
        n
        for n in model.graph.node
        if n.name in names and n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits
    ]
    weights = {n.input[1]: numpy_helper.to_array(inits[n.input[1]]).astype(np.float32) for n in nodes}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    kept = [t for t in probe.graph.initializer if t.name not in weights]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    probe.graph.input.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(w.shape)) for name, w in weights.items()
    )
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    first = session.get_outputs()[0].name
    feed = {**feeds[0], **weights}
    reference = np.asarray(session.run([first], feed)[0])[0]
    out = []
    for n in nodes:
        w = weights[n.input[1]]
        logits = np.asarray(session.run([first], {**feed, n.input[1]: quantized_copy(w, bits, block, symmetric)})[0])[0]
        sensitivity = _kl(reference, logits)
        kept_bytes = w.size * (4 if fallback is None else fallback / 8)
        out.append(Candidate(n.name, n.input[1], sensitivity, int(kept_bytes - w.size * bits / 8)))
    return sorted(out, key=lambda c: (-c.sensitivity / max(c.extra_bytes, 1), c.node))


def _kl(reference: NDArray[np.generic], logits: NDArray[np.generic]) -> float:
    from onnxbuild.steps.text_quality import Tally

    tally = Tally()
    tally.add(reference, logits, reference.argmax(-1))
    return max(0.0, tally.kl / tally.count)


def figures(
    reference: list[NDArray[np.generic]], logits: list[NDArray[np.generic]], targets: list[NDArray[np.generic]]
) -> dict[str, float]:
    """ppl_increase and kld_mean of ``logits`` against the float file's ``reference`` (both
    lists of [positions, vocab]), predicting ``targets``."""
    from onnxbuild.steps.text_quality import Tally

    tally = Tally()
    for ref, got, tgt in zip(reference, logits, targets, strict=True):
        tally.add(ref, got, tgt)
    return {
        "ppl_increase": math.exp((tally.nll - tally.nll_reference) / tally.count) - 1.0,
        "kld_mean": max(0.0, tally.kl / tally.count),
    }


def meets(found: dict[str, float], budget: dict[str, float]) -> bool:
    return ("ppl_increase_max" not in budget or found["ppl_increase"] <= budget["ppl_increase_max"]) and (
        "kld_max" not in budget or found["kld_mean"] <= budget["kld_max"]
    )


def search(
    order: list[Candidate],
    evaluate: Callable[[int], dict[str, float]],
    budget: dict[str, float],
    what: str,
    note: str = "",
) -> tuple[int, dict[str, float], list[dict[str, float]]]:
    """The least k (keeping ``order[:k]``) whose figures meet ``budget``: 0, 1, 2, 4, ... then
    bisection. Raises a StepError naming the best plan when even every MatMul kept fails."""
    tried: list[dict[str, float]] = []
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
                    f"{what}.budget: no plan meets {wanted}{note} on the calibration text: "
                    f"the best found keeps {best} of {len(order)} MatMuls "
                    f"at the fallback precision and reaches {shown}; raise the budget, set budget.fallback: float, "
                    "or use more bits"
                )
            k = min(len(order), max(1, 2 * k))
    while high - low > 1:
        mid = (low + high) // 2
        if meets(at(mid), budget):
            high = mid
        else:
            low = mid
    return high, seen[high], tried
