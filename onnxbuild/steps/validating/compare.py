"""Comparing outputs: numpy.allclose's rule with both tolerances explicit, the feeds cast to what
a session declares, and the pooling and cosine of sentence embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar, overload

from onnxbuild._util import atol_scale_of
from onnxbuild.report.validation import (
    OutputComparison,
)
from onnxbuild.runtimes.sessions import Session

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

_K = TypeVar("_K")
_V = TypeVar("_V")


def as_declared(session: Session, feeds: Mapping[str, NDArray[np.generic]]) -> dict[str, NDArray[np.generic]]:
    """``feeds`` with float32 arrays cast to float16 where the session declares float16."""
    import numpy as np

    halves = {i.name for i in session.get_inputs() if i.type == "tensor(float16)"}
    return {
        k: v.astype(np.float16) if k in halves and getattr(v, "dtype", None) == np.float32 else v
        for k, v in feeds.items()
    }


def compare(ref: NDArray[np.generic], got: NDArray[np.generic], rtol: float, atol: float) -> OutputComparison:
    """Compare one output as numpy.allclose(got, ref, rtol, atol * scale) does, with figures.

    An element mismatches when ``|got - ref| > atol * scale + rtol * |ref|`` (the tolerance
    scales with the reference, not with the ONNX value), where ``scale`` is the largest
    finite ``|ref|`` of the whole output, or 1 when that is smaller (see ``atol_scale``).
    Non-finite values match only their
    like (NaN with NaN, +inf with +inf); any other NaN or inf mismatches whatever the
    tolerance, with an infinite difference. Returns figures even when shapes differ
    (then it fails).
    """
    import numpy as np

    result: OutputComparison = {
        "shape_expected": list(ref.shape),
        "shape_onnx": list(got.shape),
        "max_abs_diff": None,
        "max_rel_diff": None,
        "mismatch_fraction": None,
        "worst_index": None,
        "worst_onnx": None,
        "worst_reference": None,
        "rtol": rtol,
        "atol": atol,
        "atol_scale": 1.0,
        "passed": False,
    }
    if ref.shape != got.shape:
        return result
    if ref.size == 0:
        return {**result, "max_abs_diff": 0.0, "max_rel_diff": 0.0, "mismatch_fraction": 0.0, "passed": True}
    ref64 = ref.astype(np.float64)
    got64 = got.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(got64)
    alike = (ref64 == got64) | (np.isnan(ref64) & np.isnan(got64))
    special = ~finite & ~alike
    with np.errstate(invalid="ignore"):
        diff = np.where(finite, np.abs(got64 - ref64), np.where(special, np.inf, 0.0))
    scale = np.abs(np.where(finite, ref64, 0.0))
    atol_scale = atol_scale_of(ref64[finite])
    tolerance = atol * atol_scale + rtol * scale
    bad = special | (diff > tolerance)
    rel = diff / np.maximum(scale, np.finfo(np.float32).tiny)
    worst = np.unravel_index(int(np.argmax(np.where(special, np.inf, diff - tolerance))), diff.shape)
    return {
        **result,
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float(rel.max()),
        "mismatch_fraction": float(bad.mean()),
        "worst_index": [int(i) for i in worst],
        "worst_onnx": float(got64[worst]),
        "worst_reference": float(ref64[worst]),
        "atol_scale": atol_scale,
        "passed": not bool(bad.any()),
    }


@overload
def json_safe(data: dict[_K, _V]) -> dict[_K, object]: ...
@overload
def json_safe(data: object) -> object: ...
def json_safe(data: object) -> object:
    """``data`` with NaN and infinities spelled as the strings "NaN", "Infinity", "-Infinity".

    Reports are strict JSON (json.dumps(allow_nan=False)), and a NaN from ONNX Runtime
    is exactly what a failed validation must be able to show.
    """
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else ("Infinity" if data > 0 else "-Infinity")
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def mean_pool(hidden: ArrayLike, mask: ArrayLike) -> NDArray[np.float64]:
    """Mean of ``hidden`` [batch, sequence, width] over the positions where ``mask`` [batch, sequence] is set.

    As sentence-transformers pools: padding does not count, and an all-padding row gives zeros.
    """
    import numpy as np

    weights = np.asarray(mask, dtype=np.float64)[..., None]
    total: NDArray[np.float64] = (np.asarray(hidden, dtype=np.float64) * weights).sum(axis=1)
    pooled: NDArray[np.float64] = total / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled


def cosine_rows(a: ArrayLike, b: ArrayLike) -> NDArray[np.float64]:
    """Cosine similarity of each row of ``a`` with the same row of ``b`` (float64).

    Two zero rows count as identical (1.0), one zero row as unrelated (0.0); a NaN stays NaN,
    so it fails any threshold.
    """
    import numpy as np

    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = np.linalg.norm(a64, axis=-1), np.linalg.norm(b64, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (a64 * b64).sum(axis=-1) / (na * nb)
    cos = np.where((na == 0) & (nb == 0), 1.0, np.where((na == 0) | (nb == 0), 0.0, cos))
    clipped: NDArray[np.float64] = np.clip(cos, -1.0, 1.0)
    return clipped
