"""One case on each target: ONNX Runtime's providers, onnxruntime-web under Node.js and OpenVINO's
CPU plugin in the precision it picks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from onnxbuild._util import brief
from onnxbuild.report.validation import (
    OpenVinoResult,
    OpenVinoVerdict,
    ShapeResult,
    WebResult,
)
from onnxbuild.runtimes import openvino_target
from onnxbuild.steps.validating.compare import compare

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Array = NDArray[np.generic]
    Keep = Callable[[str, Array], Array]
    """An output as it is compared: at the real tokens only, for a left-padded case (``RealTokens.keep``)."""


REFUSED = "{engine} could not run the graph (not a numeric difference)"
"""How a target's error at one case begins: the engine refused the file, it computed no number."""


class _OpenVinoRequired(TypedDict):
    precision: openvino_target.Precision
    runner: int


class OpenVinoOptions(_OpenVinoRequired, total=False):
    """The validate step's ``openvino`` param (steps/validate.py): the target's precision, the
    runner's version (for the key only), and the recipe's own tolerances where it gives them."""

    atol: float
    rtol: float
    top1_min: float


def web_case(
    model: Path,
    feeds: Mapping[str, Array],
    names: list[str],
    reference: list[Array],
    produced: list[Array],
    rtol: float,
    atol: float,
    keep: Keep,
) -> WebResult:
    """One validation case in onnxruntime-web: against the source model, and how far from ORT's CPU provider."""

    from onnxbuild import web

    run = web.run(model, feeds)
    if run.error:
        return {"passed": False, "error": f"onnxruntime-web: {run.error}", "outputs": {}, "max_abs_diff_vs_cpu": None}
    return _runtime_case(
        "onnxruntime-web", {n: keep(n, v) for n, v in run.outputs.items()}, names, reference, produced, rtol, atol
    )


def _runtime_case(
    runtime: str,
    got: Mapping[str, Array],
    names: list[str],
    reference: list[Array],
    produced: list[Array],
    rtol: float,
    atol: float,
) -> WebResult:
    """Another runtime's outputs at one case: against the source model, and how far from ORT's CPU provider."""
    import numpy as np

    outputs = {
        name: compare(ref, np.asarray(got[name]), rtol, atol)
        for name, ref in zip(names, reference, strict=False)
        if name in got
    }
    vs_cpu = [
        float(np.abs(np.asarray(got[n], dtype=np.float64) - np.asarray(cpu, dtype=np.float64)).max())
        for n, cpu in zip(names, produced, strict=False)
        if n in got and np.asarray(cpu).size and np.shape(got[n]) == np.shape(cpu)
    ]
    missing = [n for n in names if n not in got]
    return {
        "passed": not missing and all(c["passed"] for c in outputs.values()),
        "error": f"{runtime} returned no {', '.join(missing)}" if missing else None,
        "outputs": outputs,
        "max_abs_diff_vs_cpu": max(vs_cpu) if vs_cpu else None,
    }


@dataclass
class _OpenVino:
    """The openvino target for one variant: the compiled model (None when it could not be
    compiled or OpenVINO is missing), the tolerances for the precision it computes in."""

    session: openvino_target.Session | None
    precision: str
    atol: float
    rtol: float
    top1_min: float | None
    note: str
    error: str | None = None

    def report(self, results: list[ShapeResult], hits: int, total: int) -> OpenVinoVerdict:
        """The whole-variant verdict: compiled, top-1 floor over every case (each case's own
        verdict is in its shape's result)."""
        top1 = (
            {
                "agreement": hits / total,
                "tokens": total,
                "min": self.top1_min,
                "passed": self.top1_min is None or hits / total >= self.top1_min,
            }
            if total
            else None
        )
        cases = [r["openvino"] for r in results if "openvino" in r]
        diffs = [c["max_abs_diff"] for case in cases for c in case["outputs"].values() if c["max_abs_diff"] is not None]
        return {
            "passed": self.error is None and (top1 is None or bool(top1["passed"])) and all(c["passed"] for c in cases),
            "skipped": self.session is None and self.error is None,
            "note": self.note,
            "precision": self.precision,
            "atol": self.atol,
            "rtol": self.rtol,
            "top1": top1,
            "error": self.error,
            "max_abs_diff": max(diffs) if diffs else None,
        }


def openvino_target_for(
    options: OpenVinoOptions | None, model_file: Path, rtol: float, atol: float, top1_min: float | None = None
) -> _OpenVino | None:
    """Compile the variant for OpenVINO and pick its tolerances from the precision it reports.

    The variant's own tolerances (``rtol``, ``atol``, ``top1_min``: an int8 file's are int8's)
    are the floor: OpenVINO's rounding comes on top of the file's, never instead of it."""
    if options is None:
        return None
    why = openvino_target.unavailable()
    if why:
        return _OpenVino(None, options["precision"], atol, rtol, None, f"skipped: {why}")
    try:
        session = openvino_target.load(model_file, precision=options["precision"])
    except Exception as exc:
        return _OpenVino(
            None,
            options["precision"],
            atol,
            rtol,
            None,
            "failed",
            error=f"OpenVINO {openvino_target.version()} cannot compile the model (not a numeric difference): "
            f"{brief(exc, lines=None, limit=400)}",
        )
    used = session.precision
    default_atol, default_rtol = (
        max(a, b) for a, b in zip(openvino_target.TOLERANCES.get(used, (atol, rtol)), (atol, rtol), strict=True)
    )
    o_atol, o_rtol = float(options.get("atol", default_atol)), float(options.get("rtol", default_rtol))
    floors = [f for f in (top1_min, openvino_target.TOP1_MIN if used != "f32" else None) if f is not None]
    floor = options.get("top1_min", min(floors) if floors else None)
    asked = "" if options["precision"] == "auto" else f", asked {options['precision']}"
    held = "; KV cache held in the model (stateful)" if session.keeps_past else ""
    note = (
        f"OpenVINO {openvino_target.version()} CPU, inference precision {used}{asked}{held}; atol {o_atol:g}, "
        f"rtol {o_rtol:g}"
    )
    return _OpenVino(session, used, o_atol, o_rtol, None if floor is None else float(floor), note)


def openvino_case(
    target: _OpenVino,
    feeds: Mapping[str, Array],
    names: list[str],
    reference: list[Array],
    produced: list[Array],
    top1_gated: bool,
    keep: Keep,
) -> OpenVinoResult:
    """One validation case in OpenVINO, with its precision's tolerances; top-1 agreement for language models."""
    import numpy as np

    session = target.session
    try:
        assert session is not None  # validate.py runs only a compiled target
        got = {n: keep(n, v) for n, v in zip(names, session.run(names, feeds), strict=True)}
    except Exception as exc:
        engine = f"OpenVINO {openvino_target.version()}"
        return {
            "passed": False,
            "error": f"{REFUSED.format(engine=engine)}: {brief(exc, lines=None, limit=400)}",
            "outputs": {},
            "max_abs_diff_vs_cpu": None,
            "top1_agreement": None,
        }
    case = _runtime_case("OpenVINO", got, names, reference, produced, target.rtol, target.atol)
    top1 = None
    if top1_gated and names[0] in got and np.shape(got[names[0]]) == reference[0].shape:
        top1 = float((np.asarray(got[names[0]]).argmax(-1) == reference[0].argmax(-1)).mean())
    return {**case, "top1_agreement": top1}
