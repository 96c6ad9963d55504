"""The ``validate`` step: ONNX Runtime against the source model at several input shapes.

Tolerances follow numpy.allclose: an element mismatches when
``|onnx - torch| > atol + rtol * |torch|``; both are explicit in the recipe (numpy's
hidden rtol=1e-5 default is how Optimum lets "max diff exceeds atol" through). A
failure fails the build unless the recipe says ``on_fail: warn``.
"""

from __future__ import annotations

from typing import Any, TypedDict

from onnxbuild._util import pretty_json
from onnxbuild.errors import StepError
from onnxbuild.sources.torchmodel import (
    input_specs,
    is_language_model,
    load_source_model,
    make_inputs,
    read_source_record,
    vocab_size,
    wrap,
)
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

VERSION = 1
PACKAGES = ("torch", "transformers", "onnxruntime", "numpy")


class OutputComparison(TypedDict):
    shape_expected: list[int]
    shape_onnx: list[int]
    max_abs_diff: float | None
    max_rel_diff: float | None
    mismatch_fraction: float | None
    worst_index: list[int] | None
    worst_onnx: float | None
    worst_reference: float | None
    rtol: float
    atol: float
    passed: bool


class ShapeResult(TypedDict):
    shape: dict[str, int]
    passed: bool
    error: str | None
    outputs: dict[str, OutputComparison]
    top1_agreement: float | None


def compare(ref: Any, got: Any, rtol: float, atol: float) -> OutputComparison:
    """Compare one output. Returns figures even when shapes differ (then it fails)."""
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
        "passed": False,
    }
    if ref.shape != got.shape:
        return result
    ref64 = ref.astype(np.float64)
    got64 = got.astype(np.float64)
    diff = np.abs(got64 - ref64)
    if diff.size == 0:
        result.update(max_abs_diff=0.0, max_rel_diff=0.0, mismatch_fraction=0.0, passed=True)
        return result
    nonfinite = ~np.isfinite(got64) & np.isfinite(ref64)
    diff = np.where(nonfinite, np.inf, np.nan_to_num(diff, nan=0.0))
    rel = diff / np.maximum(np.abs(ref64), np.finfo(np.float32).tiny)
    bad = diff > atol + rtol * np.abs(ref64)
    worst = np.unravel_index(int(np.argmax(diff - (atol + rtol * np.abs(ref64)))), diff.shape)
    result.update(
        max_abs_diff=float(diff.max()),
        max_rel_diff=float(rel.max()),
        mismatch_fraction=float(bad.mean()),
        worst_index=[int(i) for i in worst],
        worst_onnx=float(got64[worst]),
        worst_reference=float(ref64[worst]),
        passed=not bool(bad.any()),
    )
    return result


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import numpy as np
    import onnxruntime as ort
    import torch

    source, export, validate = spec.params["source"], spec.params["export"], spec.params["validate"]
    variant = spec.params.get("variant", "model")
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir)
    names = [t["name"] for t in export["inputs"]]
    wrapped = wrap(model, source, names, export["outputs"])
    vocab = vocab_size(model)
    specs = input_specs(source, export, natural=True)
    language_model = is_language_model(source)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    provider = "CPUExecutionProvider"
    try:
        session = ort.InferenceSession(str(ctx.input("model.onnx")), options, providers=[provider])
    except Exception as exc:
        raise StepError(f"ONNX Runtime cannot load model.onnx: {_first_line(exc)}") from None

    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    top1_min = validate.get("top1_min")
    results: list[ShapeResult] = []
    for i, sizes in enumerate(validate["shapes"]):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        with torch.no_grad():
            reference = [t.detach().float().cpu().numpy() for t in wrapped(*(torch.from_numpy(feeds[n]) for n in names))]
        shape_result: ShapeResult = {"shape": dict(sizes), "passed": False, "error": None, "outputs": {}, "top1_agreement": None}
        try:
            produced = session.run(export["outputs"], feeds)
        except Exception as exc:
            shape_result["error"] = f"ONNX Runtime refused the inputs: {_first_line(exc)}{_fixed_axis_hint(export, feeds)}"
            results.append(shape_result)
            continue
        ok = True
        for name, ref, got in zip(export["outputs"], reference, produced):
            cmp = compare(ref, np.asarray(got), rtol, atol)
            shape_result["outputs"][name] = cmp
            ok = ok and cmp["passed"]
        if language_model and export["outputs"][0] in shape_result["outputs"]:
            ref, got = reference[0], np.asarray(produced[0])
            if ref.shape == got.shape:
                agreement = float((ref.argmax(-1) == got.argmax(-1)).mean())
                shape_result["top1_agreement"] = agreement
                if top1_min is not None and agreement < float(top1_min):
                    ok = False
        shape_result["passed"] = ok
        results.append(shape_result)

    passed = all(r["passed"] for r in results)
    report = {
        "passed": passed,
        "weights": record.get("weights"),
        "weights_note": record.get("why", ""),
        "variants": {
            variant: {
                "passed": passed,
                "provider": provider,
                "rtol": rtol,
                "atol": atol,
                "top1_min": top1_min,
                "shapes": results,
            }
        },
    }
    ctx.output("reports/validation.json").write_text(pretty_json(report), encoding="utf-8")
    ctx.output("reports/validation.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
    worst = max((c["max_abs_diff"] or 0.0 for r in results for c in r["outputs"].values()), default=0.0)
    summary = f"{'passed' if passed else 'FAILED'} at {len(results)} shapes, max abs diff {worst:.2e}"
    if record.get("weights") == "random-init":
        summary += ", weights: random-init"
    data = {"passed": passed, "max_abs_diff": worst, "shapes": len(results)}
    if passed:
        return StepResult(summary=summary, data=data)
    message = failure_message(results, variant)
    if validate["on_fail"] == "warn":
        return StepResult(summary=summary, data=data, warnings=(message + " (validate.on_fail: warn)",))
    hint = "" if any(r["error"] for r in results) else " Loosen validate.atol/rtol only if the difference is expected."
    raise StepError(f"{message}. Reports: artifacts/{ctx.recipe_name}/failed/validate/.{hint}")


def failure_message(results: list[ShapeResult], variant: str) -> str:
    for r in results:
        if r["passed"]:
            continue
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        if r["error"]:
            return f"validation of {variant} failed at shape {shape}: {r['error']}"
        for name, c in r["outputs"].items():
            if c["passed"]:
                continue
            if c["max_abs_diff"] is None:
                return f"validation of {variant} failed at shape {shape}: output {name} has shape {c['shape_onnx']}, expected {c['shape_expected']}"
            return (
                f"validation of {variant} failed at shape {shape}: output {name}: {c['mismatch_fraction']:.2%} of elements outside "
                f"atol={c['atol']:g} + rtol={c['rtol']:g}*|ref|; worst at {c['worst_index']}: onnx {c['worst_onnx']:.6g} vs torch "
                f"{c['worst_reference']:.6g} (abs diff {c['max_abs_diff']:.3g})"
            )
        if r["top1_agreement"] is not None:
            return f"validation of {variant} failed at shape {shape}: top-1 token agreement {r['top1_agreement']:.3f} is below validate.top1_min"
    return f"validation of {variant} failed"


def _fixed_axis_hint(export: dict[str, Any], feeds: dict[str, Any]) -> str:
    for t in export["inputs"]:
        fixed = [i for i, d in enumerate(t["shape"]) if isinstance(d, int)]
        for i in fixed:
            if t["name"] in feeds and i < feeds[t["name"]].ndim and feeds[t["name"]].shape[i] != t["shape"][i]:
                return (
                    f" (export.inputs declares {t['name']} axis {i} fixed at {t['shape'][i]}; "
                    "name it, e.g. sequence, to make it dynamic)"
                )
    return ""


def markdown(report: dict[str, Any], name: str) -> str:
    lines = [f"# {name}: validation against the source model", ""]
    if report.get("weights") == "random-init":
        lines += [f"> weights: **random-init** ({report.get('weights_note') or 'seeded'}): figures compare the export, not a trained model", ""]
    lines += [f"Overall: **{'passed' if report['passed'] else 'FAILED'}**", ""]
    for variant, v in report["variants"].items():
        lines += [
            f"## {variant} ({v['provider']}, atol {v['atol']:g}, rtol {v['rtol']:g})",
            "",
            "| shape | output | max abs diff | max rel diff | mismatched | top-1 agreement | result |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in v["shapes"]:
            shape = ", ".join(f"{k}={n}" for k, n in r["shape"].items())
            top1 = f"{r['top1_agreement']:.3f}" if r["top1_agreement"] is not None else "-"
            if r["error"]:
                lines.append(f"| {shape} | - | - | - | - | - | error: {r['error']} |")
            for out, c in r["outputs"].items():
                fmt = (lambda x: "-" if x is None else f"{x:.2e}")
                mism = "-" if c["mismatch_fraction"] is None else f"{c['mismatch_fraction']:.2%}"
                lines.append(f"| {shape} | {out} | {fmt(c['max_abs_diff'])} | {fmt(c['max_rel_diff'])} | {mism} | {top1} | {'pass' if c['passed'] and r['passed'] else 'FAIL'} |")
        lines.append("")
    return "\n".join(lines)


def _first_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text[:500] if text else type(exc).__name__
