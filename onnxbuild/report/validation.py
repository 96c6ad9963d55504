"""reports/validation.json's typed shape and its Markdown (pure functions, no runtime).

The validate step fills these records; the report step merges one per variant; this
module turns them into the verdict table, the per-variant figures and the one-sentence
failure message a build prints. One module (~470 lines): the report's types and every
sentence written from them stay together, so a field added to a record is rendered beside
its declaration (about half of it is the TypedDicts and their field notes)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal, TypedDict, cast

from onnxbuild.quant.weightcheck import WeightCheck


class OutputComparison(TypedDict):
    """One output at one shape: ONNX Runtime against the source model, numpy.allclose-style."""

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
    atol_scale: float
    """atol is in units of the output's own range: multiplied by its largest |reference|, at least 1."""
    passed: bool


def atol_shown(c: OutputComparison) -> str:
    """``atol=1e-4`` or, where the output's range scales it, ``atol=1e-4x31.2``."""
    scale = c.get("atol_scale", 1.0)
    return f"atol={c['atol']:g}" + (f"x{scale:.3g}" if scale != 1.0 and c["atol"] else "")


class WebResult(TypedDict):
    """onnxruntime-web's outputs at one shape, against the source model and the CPU provider."""

    passed: bool
    error: str | None
    outputs: dict[str, OutputComparison]
    """onnxruntime-web against the source model, with the variant's tolerances."""
    max_abs_diff_vs_cpu: float | None
    """The largest difference from ONNX Runtime's CPU provider on the same inputs."""


class OpenVinoResult(WebResult):
    """OpenVINO's outputs at one case, with the tolerances of the precision it computed in."""

    top1_agreement: float | None


class OpenVinoVerdict(TypedDict):
    """The openvino target for one variant: how it ran and its whole-variant gates."""

    passed: bool
    skipped: bool
    note: str
    precision: str
    """The inference precision OpenVINO reported for the compiled model (bf16, f32, f16)."""
    atol: float
    rtol: float
    top1: Mapping[str, object] | None
    """agreement, tokens, min (the floor or None) and passed, over every case."""
    error: str | None
    max_abs_diff: float | None


class ShapeResult(TypedDict, total=False):
    """Every output at one input shape, with the verdict."""

    shape: dict[str, int]
    passed: bool
    error: str | None
    outputs: dict[str, OutputComparison]
    top1_agreement: float | None
    web: WebResult
    openvino: OpenVinoResult


class AccuracyResult(TypedDict):
    """validate.accuracy: top-1 accuracy through PyTorch and ONNX Runtime on a labelled set."""

    dataset: str
    samples: int
    pytorch: float
    onnxruntime: float
    agreement: float
    """Fraction of samples on which the two predict the same class."""
    max_drop: float
    min: float | None
    passed: bool


class EmbeddingResult(TypedDict):
    """validate.sentences: cosine similarity of pooled sentence embeddings to PyTorch's."""

    sentences: int
    sequence: int
    """Tokens in the padded batch."""
    pooling: Literal["mean", "none"]
    min: float
    mean: float
    worst_sentence: int
    max_abs_diff: float
    cosine_min: float | None
    passed: bool


class TextQuality(TypedDict):
    """One variant's figures on validate.text, and its gates (None: not gated)."""

    text: str
    """Where the text came from (file, package file, or inline)."""
    windows: int
    window: int
    predictions: int
    perplexity_reference: float
    perplexity: float
    ppl_increase: float
    kld_mean: float
    top1_agreement: float
    ppl_increase_max: float | None
    kld_max: float | None
    text_top1_min: float | None
    passed: bool


def text_failures(q: TextQuality) -> list[str]:
    """Each gate the figures miss, as words."""
    out = []
    if q["ppl_increase_max"] is not None and q["ppl_increase"] > q["ppl_increase_max"]:
        out.append(
            f"perplexity {q['perplexity']:.3f} is {q['ppl_increase']:+.2%} over PyTorch's "
            f"{q['perplexity_reference']:.3f} (ppl_increase_max {q['ppl_increase_max']:.2%})"
        )
    if q["kld_max"] is not None and q["kld_mean"] > q["kld_max"]:
        out.append(f"mean KL divergence from PyTorch {q['kld_mean']:.4f} is over kld_max {q['kld_max']:g}")
    if q["text_top1_min"] is not None and q["top1_agreement"] < q["text_top1_min"]:
        out.append(
            f"top-1 agreement with PyTorch {q['top1_agreement']:.3f} is below text_top1_min {q['text_top1_min']:g}"
        )
    return out


def text_summary(q: TextQuality) -> str:
    """The one-line figures, as the step's summary and the benchmark's lead show them."""
    return (
        f"ppl {q['perplexity']:.3f} ({q['ppl_increase']:+.2%} vs PyTorch {q['perplexity_reference']:.3f}), "
        f"KL {q['kld_mean']:.4f}, top-1 {q['top1_agreement']:.3f}"
    )


def _drop_or_pin(variant: str, target: str, package: str) -> str:
    return (
        f"If {variant} need not run there, drop it from providers[{target}].options.variants; "
        f"otherwise pin {package} to a version that runs it"
    )


def numeric_failure(results: list[ShapeResult]) -> bool:
    """Whether a shape failed on a number (an output, or a target's output, outside its
    tolerances) rather than on an engine that refused the inputs or the graph: only then is
    loosening atol/rtol advice worth giving."""
    for r in results:
        if r["passed"] or r["error"]:
            continue
        if not all(c["passed"] for c in r["outputs"].values()):
            return True
        for target in (r.get("web"), r.get("openvino")):
            if target is not None and not target["passed"] and not target["error"]:
                return True
    return False


def failure_message(
    results: list[ShapeResult],
    variant: str,
    *,
    accuracy: AccuracyResult | None = None,
    embeddings: EmbeddingResult | None = None,
    top1: Mapping[str, object] | None = None,
    openvino: OpenVinoVerdict | None = None,
    text: TextQuality | None = None,
    weights: WeightCheck | None = None,
    base: str | None = None,
) -> str:
    """One sentence naming the first check that failed: the weights, a shape, then accuracy,
    then embeddings, then text."""
    if weights is not None and weights["failed"]:
        w = max(weights["failed"], key=lambda f: f["rel_error"])
        more = f" (and {len(weights['failed']) - 1} more)" if len(weights["failed"]) > 1 else ""
        return (
            f"validation of {variant} failed: its weight {w['name']}{more}, dequantized, is "
            f"{w['rel_error']:.3g} of its norm away from {base or 'its base'}'s float weight, where "
            f"{w['bits']}-bit rounding stays under {w['rel_max']:g}: a wrong weight, scale or zero point, "
            "not rounding"
        )
    for r in results:
        if r["passed"]:
            continue
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        if r["error"]:
            return f"validation of {variant} failed at shape {shape}: {r['error']}"
        web = r.get("web")
        if web is not None and not web["passed"] and all(c["passed"] for c in r["outputs"].values()):
            if web["error"]:
                return (
                    f"validation of {variant} in onnxruntime-web (the web target) failed at shape {shape}: "
                    f"{web['error']}. {_drop_or_pin(variant, 'web', 'onnxruntime-web (onnxbuild/web/package.json)')}"
                )
            name, c = next((n, c) for n, c in web["outputs"].items() if not c["passed"])
            return (
                f"validation of {variant} in onnxruntime-web (the web target) failed at shape {shape}: output {name}: "
                f"max abs diff {c['max_abs_diff']} vs torch (atol {c['atol']:g}, rtol {c['rtol']:g})"
            )
        ov = r.get("openvino")
        if (
            ov is not None
            and not ov["passed"]
            and all(c["passed"] for c in r["outputs"].values())
            and openvino is not None
        ):
            where = f"validation of {variant} on OpenVINO ({openvino['precision']} inference) failed at shape {shape}"
            if ov["error"]:
                return f"{where}: {ov['error']}. {_drop_or_pin(variant, 'openvino', 'the openvino package')}"
            name, c = next((n, c) for n, c in ov["outputs"].items() if not c["passed"])
            return (
                f"{where}: output {name}: {c['mismatch_fraction']:.2%} of elements outside "
                f"{atol_shown(c)} + rtol={c['rtol']:g}*|ref| (max abs diff {c['max_abs_diff']:.3g}); "
                "set providers[openvino].options atol/rtol if that precision is acceptable"
            )
        for name, c in r["outputs"].items():
            if c["passed"]:
                continue
            if c["max_abs_diff"] is None:
                return (
                    f"validation of {variant} failed at shape {shape}: output {name} has shape {c['shape_onnx']}, "
                    f"expected {c['shape_expected']}"
                )
            return (
                f"validation of {variant} failed at shape {shape}: output {name}: "
                f"{c['mismatch_fraction']:.2%} of elements outside {atol_shown(c)} + rtol={c['rtol']:g}*|ref|; "
                f"worst at {c['worst_index']}: onnx {c['worst_onnx']:.6g} vs torch {c['worst_reference']:.6g} "
                f"(abs diff {c['max_abs_diff']:.3g})"
            )
    if top1 is not None and not top1["passed"]:
        return (
            f"validation of {variant} failed: top-1 agreement {top1['agreement']:.3f} over {top1['tokens']} "
            f"predictions at all shapes is below top1_min {top1['min']:g}"
        )
    if openvino is not None and openvino["error"]:
        return (
            f"validation of {variant} on OpenVINO failed: {openvino['error']}. "
            f"{_drop_or_pin(variant, 'openvino', 'the openvino package')}"
        )
    if openvino is not None and openvino["top1"] is not None and not openvino["top1"]["passed"]:
        t = openvino["top1"]
        return (
            f"validation of {variant} on OpenVINO ({openvino['precision']} inference) failed: "
            f"top-1 agreement {t['agreement']:.3f} over {t['tokens']} predictions at all shapes is below {t['min']:g} "
            "(providers[openvino].options.top1_min)"
        )
    if accuracy is not None and not accuracy["passed"]:
        where = f"on {accuracy['samples']} samples from {accuracy['dataset']}"
        drop = accuracy["pytorch"] - accuracy["onnxruntime"]
        if drop > accuracy["max_drop"] + 1e-9:
            return (
                f"validation of {variant} failed: ONNX Runtime's top-1 accuracy {accuracy['onnxruntime']:.4f} "
                f"is {drop:.4f} below PyTorch's {accuracy['pytorch']:.4f} {where} "
                f"(validate.accuracy.max_drop: {accuracy['max_drop']:g})"
            )
        return (
            f"validation of {variant} failed: ONNX Runtime's top-1 accuracy {accuracy['onnxruntime']:.4f} {where} is "
            f"below validate.accuracy.min ({accuracy['min']:g})"
        )
    if embeddings is not None and not embeddings["passed"]:
        return (
            f"validation of {variant} failed: sentence {embeddings['worst_sentence']}'s embedding has "
            f"cosine similarity {embeddings['min']:.6f} to PyTorch's, "
            f"below validate.cosine_min ({embeddings['cosine_min']:g}; "
            f"mean over {embeddings['sentences']} sentences {embeddings['mean']:.6f})"
        )
    if text is not None and not text["passed"]:
        return (
            f"validation of {variant} failed on validate.text ({text['text']}, {text['predictions']} predictions): "
            f"{'; '.join(text_failures(text))}; if the loss is acceptable, set the variant's own validate: gates"
        )
    return f"validation of {variant} failed"


class VariantReport(TypedDict, total=False):
    """One variant in reports/validation.json: every shape's results and the whole-variant gates."""

    provider: str
    rtol: float
    atol: float
    shapes: list[ShapeResult]
    top1: Mapping[str, object] | None
    accuracy: AccuracyResult | None
    embedding_cosine: EmbeddingResult | None
    text: TextQuality | None
    openvino: OpenVinoVerdict | None
    web: str
    left_padding: str
    int8_kernels: str | None
    weights: WeightCheck | None


class ValidationReport(TypedDict, total=False):
    """reports/validation.json: every variant's validation, merged by the report step."""

    passed: bool
    variants: dict[str, VariantReport]
    weights: str
    weights_note: str
    reference: str


_NO_WEB: WebResult = {"passed": True, "error": None, "outputs": {}, "max_abs_diff_vs_cpu": None}
"""A shape the web target did not run: no error, no outputs (read only)."""


def markdown(merged: Mapping[str, object], name: str) -> str:
    """The verdict first (one row per variant and shape, its worst output), details after, folded."""
    # the report step's merge of reports/validation/<variant>.json, files the validate steps of
    # this package wrote in this shape (json.loads hands them back untyped)
    report = cast(ValidationReport, merged)
    lines = [f"# {name}: validation against the source model", ""]
    if report.get("weights") == "random-init":
        lines += [
            f"> weights: **random-init** ({report.get('weights_note') or 'seeded'}): figures compare the export, "
            "not a trained model",
            "",
        ]
    lines += [f"Overall: **{'passed' if report['passed'] else 'FAILED'}**", ""]
    lines += [
        "| variant | shape | worst output | max abs diff | tolerance | top-1 agreement | result |",
        "|---|---|---|---|---|---|---|",
    ]
    variants = sorted(report["variants"].items(), key=lambda kv: {"model": 0, "optimized": 1}.get(kv[0], 2))
    for variant, v in variants:
        for r in v["shapes"]:
            shape = ", ".join(f"{k}={n}" for k, n in r["shape"].items())
            top1 = f"{r['top1_agreement']:.3f}" if r["top1_agreement"] is not None else "-"
            web = r.get("web") or _NO_WEB
            ok = (
                r["passed"]
                and all(c["passed"] for c in r["outputs"].values())
                and not web.get("error")
                and all(c["passed"] for c in web.get("outputs", {}).values())
            )
            lines.append(_verdict_row(variant, shape, r["outputs"], r["error"], top1, v, ok))
            ov = r.get("openvino")
            if ov is not None and (o := v.get("openvino")):
                o_top1 = f"{ov['top1_agreement']:.3f}" if ov["top1_agreement"] is not None else "-"
                lines.append(
                    _verdict_row(
                        f"{variant} on OpenVINO ({o['precision']})",
                        shape,
                        ov["outputs"],
                        ov["error"],
                        o_top1,
                        o,
                        ov["passed"],
                    )
                )
    lines.append("")
    for variant, v in variants:
        lines += _variant_figures(variant, v, report.get("reference"))
    lines += ["## Details", ""]
    for variant, v in variants:
        n = sum(len(r["outputs"]) for r in v["shapes"])
        lines += [
            "<details>",
            f"<summary>{variant} ({v['provider']}): {n} output comparisons at {len(v['shapes'])} shapes</summary>",
            "",
            "| shape | output | max abs diff | max rel diff | mismatched | result |",
            "|---|---|---|---|---|---|",
        ]
        for r in v["shapes"]:
            shape = ", ".join(f"{k}={n}" for k, n in r["shape"].items())
            if r["error"]:
                lines.append(f"| {shape} | - | - | - | - | error: {_cell(r['error'])} |")
            web = r.get("web") or _NO_WEB
            rows = [(out, c, "") for out, c in r["outputs"].items()] + [
                (out, c, "web: ") for out, c in web.get("outputs", {}).items()
            ]
            for out, c, where in sorted(rows, key=lambda t: (t[2], natural_key(t[0]))):
                mism = "-" if c["mismatch_fraction"] is None else f"{c['mismatch_fraction']:.2%}"
                lines.append(
                    f"| {shape} | {where}{out} | {_sci(c['max_abs_diff'])} | {_sci(c['max_rel_diff'])} | {mism} | "
                    f"{'pass' if c['passed'] else 'FAIL'} |"
                )
            if web_error := web.get("error"):
                lines.append(f"| {shape} | web | - | - | - | error: {_cell(web_error)} |")
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def _verdict_row(
    who: str,
    shape: str,
    outputs: Mapping[str, OutputComparison],
    error: str | None,
    top1: str,
    tolerances: Mapping[str, object],
    ok: bool,
) -> str:
    """One row of the verdict table: the worst output at one case, or the error."""
    tol = f"atol {tolerances['atol']:g}, rtol {tolerances['rtol']:g}"
    if error:
        return f"| {who} | {shape} | - | - | {tol} | - | **FAIL**: {_cell(error)} |"
    worst = _worst(outputs)
    diff = _sci(outputs[worst]["max_abs_diff"]) if worst else "-"
    return f"| {who} | {shape} | {worst or '-'} | {diff} | {tol} | {top1} | {'pass' if ok else '**FAIL**'} |"


def _variant_figures(variant: str, v: VariantReport, reference: str | None) -> list[str]:
    """The whole-variant gates (top-1 agreement, accuracy, embeddings, the web target), one block each."""
    lines: list[str] = []
    if v.get("left_padding"):
        lines += [f"{variant}: {v['left_padding']}.", ""]
    if v.get("web"):
        lines += [f"{variant}: web target: {v['web']}.", ""]
    if (w := v.get("weights")) and w["worst"] is not None:
        worst = w["worst"]
        skipped = f"; {len(w['not_checked'])} not checked (no float weight of that name)" if w["not_checked"] else ""
        lines += [
            f"{variant}: weights check: {w['checked']} quantized tensors dequantized against the base file's, "
            f"worst {worst['name']} at relative error {worst['rel_error']:.3f} (at most {worst['rel_max']:g})"
            f"{skipped}: {'pass' if w['passed'] else 'FAIL'}.",
            "",
        ]
    if v.get("int8_kernels"):
        lines += [f"{variant}: {v['int8_kernels']}.", ""]
    if o := v.get("openvino"):
        lines += [
            f"{variant}: openvino target: {o['note']}" + (f"; error: {o['error']}" if o["error"] else "") + ".",
            "",
        ]
        if t := o["top1"]:
            floor = f" (at least {t['min']:g})" if t["min"] is not None else ""
            lines += [
                f"{variant} on OpenVINO: top-1 agreement over all {t['tokens']} predictions: "
                f"**{t['agreement']:.3f}**{floor}: {'pass' if t['passed'] else 'FAIL'}",
                "",
            ]
    if t := v.get("top1"):
        floor = f" (at least {t['min']:g})" if t["min"] is not None else ""
        floor += f" ({t['note']})" if t.get("note") else ""
        lines += [
            f"{variant}: top-1 agreement over all {t['tokens']} predictions (tokens or classes): "
            f"**{t['agreement']:.3f}**{floor}: {'pass' if t['passed'] else 'FAIL'}",
            "",
        ]
    if a := v.get("accuracy"):
        floor = "" if a["min"] is None else f", at least {a['min']:g}"
        lines += [
            f"### {variant}: top-1 accuracy on {a['samples']} samples from `{a['dataset']}`",
            "",
            f"| {'TensorFlow' if reference == 'tensorflow' else 'PyTorch'} | ONNX Runtime | same prediction | "
            "allowed | result |",
            "|---|---|---|---|---|",
            f"| {a['pytorch']:.4f} | {a['onnxruntime']:.4f} | {a['agreement']:.2%} | drop at most "
            f"{a['max_drop']:g}{floor} | {'pass' if a['passed'] else 'FAIL'} |",
            "",
        ]
    if e := v.get("embedding_cosine"):
        pooled = "mean-pooled over the attention mask" if e["pooling"] == "mean" else "as output"
        floor = "-" if e["cosine_min"] is None else f"{e['cosine_min']:g}"
        lines += [
            f"### {variant}: sentence embeddings ({e['sentences']} sentences, padded to {e['sequence']} "
            f"tokens, {pooled})",
            "",
            "| cosine min | cosine mean | worst sentence | max abs diff | threshold | result |",
            "|---|---|---|---|---|---|",
            f"| {e['min']:.6f} | {e['mean']:.6f} | {e['worst_sentence']} | {e['max_abs_diff']:.2e} | {floor} | "
            f"{'pass' if e['passed'] else 'FAIL'} |",
            "",
        ]
    if q := v.get("text"):

        def gate(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        lines += [
            f"### {variant}: quality on text ({q['text']}: {q['windows']} windows of {q['window']} tokens, "
            f"{q['predictions']} next-token predictions)",
            "",
            "| perplexity | PyTorch's | increase | mean KL from PyTorch | top-1 = PyTorch "
            "| allowed: increase, KL, top-1 | result |",
            "|---|---|---|---|---|---|---|",
            f"| {q['perplexity']:.3f} | {q['perplexity_reference']:.3f} | {q['ppl_increase']:+.2%} | "
            f"{q['kld_mean']:.4f} | {q['top1_agreement']:.3f} | "
            f"{gate(q['ppl_increase_max'], '.1%')}, {gate(q['kld_max'], 'g')}, {gate(q['text_top1_min'], 'g')} | "
            f"{'pass' if q['passed'] else 'FAIL'} |",
            "",
        ]
    return lines


def _worst(outputs: Mapping[str, OutputComparison]) -> str | None:
    """The output to name in the verdict: the first that failed, else the largest difference."""
    failed = [n for n, c in outputs.items() if not c["passed"]]
    if failed:
        return sorted(failed, key=natural_key)[0]
    diffs = [(c["max_abs_diff"], n) for n, c in outputs.items() if c["max_abs_diff"] is not None]
    return max(diffs)[1] if diffs else None


def natural_key(name: str) -> list[int | str]:
    """Sort present.2 before present.10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _sci(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"
