"""The ``validate`` step: ONNX Runtime against the source model at several input shapes.

Tolerances follow numpy.allclose: an element mismatches when
``|onnx - torch| > atol + rtol * |torch|``; both are explicit in the recipe (numpy's
hidden rtol=1e-5 default is how Optimum lets "max diff exceeds atol" through). A
failure fails the build unless the recipe says ``on_fail: warn``.

The record types and the Markdown are in report/validation.py; what stays here (~420
lines) is the comparison and the three checks (shapes, accuracy, embeddings), which
share the loaded source model and session.

Random inputs show the export computes the same function; two optional checks show it
on real data, in the units a user cares about:

- ``validate.accuracy``: top-1 accuracy of the first output on a labelled set that a
  function in the recipe's folder returns, through PyTorch and through ONNX Runtime;
  ONNX Runtime may fall at most ``max_drop`` below PyTorch.
- ``validate.sentences``: one padded batch of real text, tokenized with the model's
  tokenizer; the first output is mean-pooled over the attention mask (as
  sentence-transformers does) and each sentence's embedding from ONNX Runtime must
  have cosine similarity of at least ``validate.cosine_min`` to PyTorch's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from onnxbuild._util import atol_scale_of, brief, pick, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import (
    SIGNATURE_KEYS,
    AccuracyCheck,
    ExportSection,
    ValidateSection,
    target_variants,
)
from onnxbuild.recipe.variants import SOURCE_RECORD, TEXT_GATES, tolerances
from onnxbuild.report.validation import (
    AccuracyResult,
    EmbeddingResult,
    OpenVinoResult,
    OpenVinoVerdict,
    OutputComparison,
    ShapeResult,
    TextQuality,
    WebResult,
    failure_message,
    markdown,
    text_summary,
)
from onnxbuild.runtimes import openvino_target, sessions
from onnxbuild.sources import section_for
from onnxbuild.sources.torchmodel import (
    full_export,
    gates_top1,
    input_specs,
    labelled_inputs,
    load_source_model,
    load_tokenizer,
    make_inputs,
    sentence_inputs,
    vocab_size,
    wrap,
)
from onnxbuild.spec import Planning, StepInput
from onnxbuild.steps import text_quality
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, read_source_record

VERSION = 11
PACKAGES = ("torch", "transformers", "tokenizers", "onnxruntime", "numpy", "openvino")


MEMORY = (4, 600)


def plan(p: Planning) -> list[StepSpec]:
    """One step per variant of a traced source, against the source model (onnx and graph
    sources have no model to compare with: check is their gate)."""
    r = p.recipe.resolved
    if not p.recipe.torch_source:
        return []
    chosen = target_variants(r["providers"])
    ov = next((q for q in r["providers"] if q["name"] == "openvino"), None)
    steps = []
    by_name = {v.name: v for v in p.variants}
    for v in p.variants:
        name = v.validate_step
        # the file the variant was made from: a failed validation looks for where they part
        base = by_name.get(v.base) if v.base and not v.files else None
        # the tokenizer is read for validate.sentences and validate.text only, the export's sample never
        source = section_for(
            r["source"],
            drop=() if r["validate"].get("sentences") or r["validate"].get("text") else ("tokenizer",),
            unset=("package",),
        )
        validate = r["validate"] | tolerances(p.recipe, v)
        if not validate.get("sentences"):  # the embedding floor applies to sentences only
            validate = pick(validate, set(validate) - {"cosine_min"})
        if not validate.get("text"):  # and the text gates to text: out of the key without it
            validate = pick(validate, set(validate) - {"text", *TEXT_GATES})
        if validate.get("left_padding", True) or not r["export"].get("with_past"):
            # in the key only where it leaves the case out: the default reruns nothing built before it
            validate = pick(validate, set(validate) - {"left_padding"})
        params = {
            "source": source,
            "export": pick(r["export"], SIGNATURE_KEYS),
            "validate": validate,
            "variant": v.name,
            "model_path": v.path,
        }
        if v.files:
            params["files"] = list(v.files)
        if v.name in chosen.get("web", ()):
            params["web"] = True  # meant for the browser: validated in onnxruntime-web too
        if ov and v.name in chosen["openvino"]:  # served by OpenVINO too: validated there, at its precision
            params["openvino"] = {
                "precision": ov["options"].get("precision", "auto"),
                "runner": openvino_target.RUNNER,
                **pick(ov["options"], {"atol", "rtol", "top1_min"}),
            }
        if base is not None:
            params["base"] = {"variant": base.name, "path": base.path}
        steps.append(
            StepSpec(
                name=name,
                kind="validate",
                params=params,
                deps=tuple(dict.fromkeys(("source", v.step, *((base.step,) if base else ())))),
                inputs=(
                    StepInput("source", SOURCE_RECORD),
                    *(StepInput(v.step, f) for f in v.paths),
                    *((StepInput(base.step, base.path),) if base else ()),
                ),
                outputs=(f"reports/validation/{v.name}.json", f"reports/validation/{v.name}.md"),
            )
        )
    return steps


def _as_declared(session: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """``feeds`` with float32 arrays cast to float16 where the session declares float16."""
    import numpy as np

    halves = {i.name for i in session.get_inputs() if i.type == "tensor(float16)"}
    return {
        k: v.astype(np.float16) if k in halves and getattr(v, "dtype", None) == np.float32 else v
        for k, v in feeds.items()
    }


def compare(ref: Any, got: Any, rtol: float, atol: float) -> OutputComparison:
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


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import numpy as np
    import onnxruntime as ort
    import torch

    source, export = spec.params["source"], cast(ExportSection, spec.params["export"])
    validate = cast(ValidateSection, spec.params["validate"])
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir)
    if spec.params.get("files"):
        from onnxbuild.sources.seq2seq import validate_files

        checked = validate_files(model, source, export, validate, [ctx.input(f) for f in spec.params["files"]], compare)
        shape_results = [cast(ShapeResult, c) for c in checked.results]
        return _finish(
            ctx, spec, record, source, validate, shape_results, checked.top1_hits, checked.top1_total, None, None, ""
        )
    export = full_export(export, model)
    names = [t["name"] for t in export["inputs"]]
    wrapped = wrap(model, source, names, export["outputs"])
    vocab = vocab_size(model)
    specs = input_specs(source, export, natural=True)
    top1_gated = gates_top1(source)

    options = sessions.options()
    provider = "CPUExecutionProvider"
    try:
        session = ort.InferenceSession(
            str(ctx.input(spec.params.get("model_path", "model.onnx"))), options, providers=[provider]
        )
    except Exception as exc:
        raise StepError(f"ONNX Runtime cannot load model.onnx: {brief(exc, lines=None, limit=500)}") from None

    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    results: list[ShapeResult] = []
    model_file = ctx.input(spec.params.get("model_path", "model.onnx"))
    web_target = bool(spec.params.get("web"))
    web_note = ""
    if web_target:
        from onnxbuild import web

        why = web.unavailable()
        if why:
            web_target, web_note = False, f"web target skipped: {why}"
        else:
            where = f", installed in {web.where()}" if web.where() else ""
            web_note = f"also validated in onnxruntime-web {web.version()} (wasm, Node.js{where})"
    ov_target = _openvino_target(spec.params.get("openvino"), model_file, rtol, atol, validate.get("top1_min"))
    ov_hits = ov_total = 0
    # Top-1 agreement gates over every token of every shape together: a shape of 8 tokens
    # alone moves in steps of 12.5%, too coarse to hold a quantized model to 0.85.
    top1_hits = top1_total = 0
    failing: dict[str, Any] | None = None  # the first numeric failure's inputs, for the search
    for i, sizes in enumerate(validation_cases(validate, export)):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        real = RealTokens.of(feeds, sizes)
        keep = real.keep
        try:
            with torch.no_grad():
                reference = [
                    keep(n, t.detach().float().cpu().numpy())
                    for n, t in zip(
                        export["outputs"], wrapped(*(torch.from_numpy(feeds[n]) for n in names)), strict=False
                    )
                ]
        except Exception as exc:  # the source model itself refuses this shape: the recipe asks too much
            shown = ", ".join(f"{d}={v}" for d, v in sizes.items())
            raise StepError(
                f"validate.shapes: PyTorch itself fails on the source model at {shown} ({type(exc).__name__}: "
                f"{brief(exc, limit=300)}); "
                "the model does not take inputs of that size: list sizes it takes under validate.shapes"
            ) from None
        shape_result: ShapeResult = {
            "shape": dict(sizes),
            "passed": False,
            "error": None,
            "outputs": {},
            "top1_agreement": None,
        }
        try:
            # a file with float16 inputs (a float16 variant without keep_io_types) takes the
            # same values rounded to float16; its float16 outputs compare as float32
            whole = [
                np.asarray(o, np.float32) if getattr(o, "dtype", None) == np.float16 else o
                for o in session.run(export["outputs"], _as_declared(session, feeds))
            ]
            produced = [keep(n, p) for n, p in zip(export["outputs"], whole, strict=True)]
        except Exception as exc:
            shape_result["error"] = (
                f"ONNX Runtime refused the inputs: {brief(exc, lines=None, limit=500)}{_fixed_axis_hint(export, feeds)}"
            )
            results.append(shape_result)
            continue
        ok = True
        for name, ref, got, full in zip(export["outputs"], reference, produced, whole, strict=False):
            cmp = compare(ref, np.asarray(got), rtol, atol)
            if real.mask is not None and np.shape(ref) == np.shape(
                got
            ):  # the whole outputs' shapes, not the real tokens'
                cmp["worst_index"] = real.index(name, np.shape(full), cmp["worst_index"])
                cmp["shape_expected"] = cmp["shape_onnx"] = list(np.shape(full))
            shape_result["outputs"][name] = cmp
            ok = ok and cmp["passed"]
        if top1_gated and export["outputs"][0] in shape_result["outputs"]:
            ref, got = reference[0], np.asarray(produced[0])
            if ref.shape == got.shape:
                same = ref.argmax(-1) == got.argmax(-1)
                shape_result["top1_agreement"] = float(same.mean())
                top1_hits += int(same.sum())
                top1_total += int(same.size)
        if web_target:
            shape_result["web"] = _web_case(model_file, feeds, export["outputs"], reference, produced, rtol, atol, keep)
            ok = ok and shape_result["web"]["passed"]
        if ov_target is not None and ov_target.session is not None:
            case = _openvino_case(ov_target, feeds, export["outputs"], reference, produced, top1_gated, keep)
            shape_result["openvino"] = case
            ok = ok and case["passed"]
            if case["top1_agreement"] is not None:
                ov_hits += round(case["top1_agreement"] * reference[0][..., 0].size)
                ov_total += reference[0][..., 0].size
        shape_result["passed"] = ok
        if not ok and failing is None:
            failing = feeds
        results.append(shape_result)

    accuracy = (
        _accuracy(validate["accuracy"], wrapped, session, export, ctx.recipe_dir)
        if validate["accuracy"] is not None
        else None
    )
    embeddings = None
    if validate["sentences"]:
        tokenizer = load_tokenizer(source, record, ctx.recipe_dir)
        feeds, mask = sentence_inputs(tokenizer, validate["sentences"], specs, validate["shapes"][0])
        embeddings = _embeddings(feeds, mask, validate.get("cosine_min"), wrapped, session, export)

    text = _text_quality(ctx, model, session, source, record, export, specs, validate) if validate.get("text") else None
    openvino = ov_target.report(results, ov_hits, ov_total) if ov_target is not None else None
    left_out = bool(export.get("with_past")) and _free_batch(export) and not validate.get("left_padding", True)
    return _finish(
        ctx,
        spec,
        record,
        source,
        validate,
        results,
        top1_hits,
        top1_total,
        accuracy,
        embeddings,
        web_note,
        provider,
        openvino,
        left_out,
        failing,
        text,
    )


def _text_quality(
    ctx: StepContext,
    model: Any,
    session: Any,
    source: dict[str, Any],
    record: dict[str, Any],
    export: ExportSection,
    specs: list[dict[str, Any]],
    validate: ValidateSection,
) -> TextQuality:
    """validate.text through the variant's session: each window one prefill from an empty past."""
    import numpy as np

    text = validate["text"]
    assert text is not None
    tokenizer = load_tokenizer(source, record, ctx.recipe_dir, key="validate.text")
    windows = text_quality.token_windows(tokenizer, text_quality.read_text(text, ctx.recipe_dir), text)
    first = export["outputs"][0]

    def run_onnx(ids: Any) -> Any:
        feeds = make_inputs(specs, {"batch": 1, "sequence": ids.shape[1], "past_sequence": 0}, seed=0, vocab=None)
        feeds["input_ids"] = ids.astype(feeds["input_ids"].dtype)
        return np.asarray(session.run([first], feeds)[0])

    return text_quality.measure(model, run_onnx, windows, text, {g: validate.get(g) for g in TEXT_GATES})


def _finish(
    ctx: StepContext,
    spec: StepSpec,
    record: dict[str, Any],
    source: dict[str, Any],
    validate: ValidateSection,
    results: list[ShapeResult],
    top1_hits: int,
    top1_total: int,
    accuracy: Any,
    embeddings: Any,
    web_note: str,
    provider: str = "CPUExecutionProvider",
    openvino: OpenVinoVerdict | None = None,
    left_out: bool = False,
    failing: dict[str, Any] | None = None,
    text: TextQuality | None = None,
) -> StepResult:
    """The verdict, the report files and the step's summary (``left_out``: the recipe turned
    the left-padded case off, which the report and summary say; ``failing``: the inputs of
    the first case that failed numerically, which the first-divergence search reruns)."""
    variant = spec.params.get("variant", "model")
    warn_only = validate["on_fail"] == "warn"  # part of every verdict: whether a failure ends the step
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    top1_min = validate.get("top1_min")
    top1 = (
        {
            "agreement": top1_hits / top1_total,
            "tokens": top1_total,
            "min": top1_min,
            "passed": top1_min is None or top1_hits / top1_total >= float(top1_min),
        }
        if top1_total
        else None
    )
    passed = (
        all(r["passed"] for r in results)
        and all(c is None or c["passed"] for c in (accuracy, embeddings, top1, text))
        and (openvino is None or openvino["passed"])
    )
    report = {
        "passed": passed,
        "weights": record.get("weights"),
        "weights_note": record.get("why", ""),
        "reference": "tensorflow" if "tensorflow" in source else "pytorch",
        "variants": {
            variant: {
                "passed": passed,
                "provider": provider,
                "rtol": rtol,
                "atol": atol,
                "top1_min": top1_min,
                "top1": top1,
                "shapes": results,
                "accuracy": accuracy,
                "embedding_cosine": embeddings,
                "text": text,
                "web": web_note or None,
                "openvino": openvino,
                "left_padding": LEFT_OUT if left_out else None,
            }
        },
    }
    # One file per variant; the report step merges them into reports/validation.json and .md.
    ctx.output(f"reports/validation/{variant}.json").write_text(pretty_json(json_safe(report)), encoding="utf-8")
    ctx.output(f"reports/validation/{variant}.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
    worst = max((c["max_abs_diff"] or 0.0 for r in results for c in r["outputs"].values()), default=0.0)
    summary = f"{'passed' if passed else 'FAILED'} at {len(results)} shapes, max abs diff {worst:.2e}"
    data: dict[str, Any] = {"passed": passed, "max_abs_diff": worst, "shapes": len(results)}
    if web_note:
        web_worst = max((r["web"]["max_abs_diff_vs_cpu"] or 0.0 for r in results if "web" in r), default=None)
        summary += f"; {web_note}" + (
            f", max abs diff vs CPU provider {web_worst:.2e}" if web_worst is not None else ""
        )
        data["web"] = web_note
    if openvino is not None:
        summary += f"; openvino: {openvino['note']}"
        data["openvino"] = {
            "passed": openvino["passed"],
            "precision": openvino["precision"],
            "max_abs_diff": openvino["max_abs_diff"],
        }
    if accuracy is not None:
        engine = "TensorFlow" if "tensorflow" in source else "PyTorch"
        summary += f", accuracy {accuracy['onnxruntime']:.4f} ({engine} {accuracy['pytorch']:.4f})"
        data["accuracy"] = {"pytorch": accuracy["pytorch"], "onnxruntime": accuracy["onnxruntime"]}
    if embeddings is not None:
        summary += f", embedding cosine min {embeddings['min']:.6f}"
        data["embedding_cosine_min"] = embeddings["min"]
    if text is not None:
        summary += f"; on text: {text_summary(text)}"
        data["text"] = {
            k: text[k] for k in ("perplexity", "perplexity_reference", "ppl_increase", "kld_mean", "top1_agreement")
        }
    if left_out:
        summary += f"; {LEFT_OUT}"
    if record.get("weights") == "random-init":
        summary += ", weights: random-init"
    data = json_safe(data)
    if passed:
        return StepResult(summary=summary, data=data)
    message = failure_message(
        results, variant, accuracy=accuracy, embeddings=embeddings, top1=top1, openvino=openvino, text=text
    )
    if warn_only:
        return StepResult(summary=summary, data=data, warnings=(message + " (validate.on_fail: warn)",))
    numeric = any(not r["passed"] and not r["error"] for r in results)
    hint = " Loosen validate.atol/rtol only if the difference is expected." if numeric else ""
    if numeric and spec.params.get("base") and failing is not None:
        hint += _first_divergence(ctx, spec, results, validate, failing)
    raise StepError(f"{message}. Reports: artifacts/{ctx.recipe_name}/failed/{spec.name}/.{hint}")


def _first_divergence(
    ctx: StepContext, spec: StepSpec, results: list[ShapeResult], validate: ValidateSection, feeds: dict[str, Any]
) -> str:
    """Where the failing variant first parts from the file it was made from, at the first
    failing shape (onnxbuild/review/divergence.py), as a sentence for the failure; its subgraph and
    inputs go to the failed step's divergence/ folder. ``feeds``: that shape's own inputs."""
    from onnxbuild.review.divergence import DIVERGENCE, first_divergence

    base = spec.params["base"]
    variant = spec.params["variant"]
    shape = next(r["shape"] for r in results if not r["passed"] and not r["error"])
    where = f"artifacts/{ctx.recipe_name}/failed/{spec.name}/{DIVERGENCE}/"
    try:
        candidate = ctx.input(spec.params["model_path"])
        found = first_divergence(
            ctx.input(base["path"]),
            candidate,
            feeds,
            float(validate["rtol"]),
            float(validate["atol"]),
            ctx.output_dir / DIVERGENCE,
        )
    except Exception as exc:  # the search is help for a failure, never a second failure
        return f" (The search for the first diverging node failed: {type(exc).__name__}: {brief(exc)}.)"
    d = found.divergence
    if d is None:
        return (
            f" Every tensor it shares with {base['variant']} agrees within these tolerances "
            f"({found.compared} compared); the difference is in what it computes anew."
        )
    module = f", from {d.module}" if d.module else ""
    return (
        f" First node where it parts from {base['variant']}: {d.node} ({d.op_type}{module}), output {d.output}, "
        f"max abs diff {d.max_abs_diff:.3g}"
        f" after {d.compared - 1} agreeing tensors; that node's subgraph and inputs: {where}"
        f" (onnxbuild explain-mismatch {ctx.recipe_path} --variant {variant}{_again(validate, shape)} to search again)."
    )


def cases(shapes: list[dict[str, int]], with_past: bool, padded: bool = False) -> list[dict[str, int]]:
    """The shapes validation runs. A with-past decoder runs each shape that names no past
    twice: as a prefill (empty past) and as one decode step after that many tokens.

    ``padded`` (a decoder with an attention_mask and a free batch axis) adds a left-padded
    batch, prefill and decode, at the first shape of two rows or more (else the first shape
    with two rows): its last row's first half is padding, as generate() pads a shorter prompt.
    Outputs are compared at the real tokens only. Attention that reads a row as a prefix of
    the cache (GroupQueryAttention's seqlens_k) passes every unpadded case and fails this one."""
    if not with_past:
        return shapes
    out: list[dict[str, int]] = []
    for sizes in shapes:
        if "past_sequence" in sizes:
            out.append(dict(sizes))
            continue
        out.append({**sizes, "past_sequence": 0})
        out.append({**sizes, "sequence": 1, "past_sequence": sizes["sequence"]})
    fresh = [s for s in shapes if "past_sequence" not in s and s.get("sequence", 0) >= 2]
    if padded and fresh:
        base = next((s for s in fresh if s.get("batch", 1) >= 2), {**fresh[0], "batch": 2})
        pad = base["sequence"] // 2
        out.append({**base, "past_sequence": 0, "left_padding": pad})
        out.append({**base, "sequence": 1, "past_sequence": base["sequence"], "left_padding": pad})
    return out


@dataclass(frozen=True)
class RealTokens:
    """For a left-padded case: each output at the real tokens only (a padded query attends to
    nothing, and what a runtime writes there is not defined): outputs laid out [batch,
    sequence, ...] at the real new tokens, ``present.*`` caches [batch, heads, total, ...] at
    every real token. Other cases (``mask`` None) compare whole outputs."""

    mask: Any = None
    past: int = 0

    @staticmethod
    def of(feeds: dict[str, Any], sizes: dict[str, int]) -> RealTokens:
        import numpy as np

        if not sizes.get("left_padding"):
            return RealTokens()
        return RealTokens(np.asarray(feeds["attention_mask"]).astype(bool), int(sizes.get("past_sequence", 0)))

    def _rule(self, name: str, shape: tuple[int, ...]) -> str:
        if self.mask is None:
            return ""
        if (
            name.startswith("present")
            and len(shape) >= 3
            and shape[0] == self.mask.shape[0]
            and shape[2] == self.mask.shape[1]
        ):
            return "cache"
        return "queries" if len(shape) >= 2 and shape[:2] == self.mask[:, self.past :].shape else ""

    def keep(self, name: str, array: Any) -> Any:
        import numpy as np

        array = np.asarray(array)
        rule = self._rule(name, array.shape)
        if rule == "cache":
            return np.moveaxis(array, 2, 1)[self.mask]
        return array[self.mask[:, self.past :]] if rule == "queries" else array

    def index(self, name: str, shape: tuple[int, ...], kept: list[int] | None) -> list[int] | None:
        """An index into ``keep``'s array, as an index into the whole output of ``shape``."""
        import numpy as np

        rule = self._rule(name, shape)
        if not rule or not kept:
            return kept
        if rule == "cache":
            b, t = (int(i) for i in np.argwhere(self.mask)[kept[0]])
            return [b, kept[1], t, *kept[2:]]
        b, s = (int(i) for i in np.argwhere(self.mask[:, self.past :])[kept[0]])
        return [b, s, *kept[1:]]


def _web_case(
    model: Any,
    feeds: dict[str, Any],
    names: list[str],
    reference: list[Any],
    produced: list[Any],
    rtol: float,
    atol: float,
    keep: Callable[[str, Any], Any],
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
    got: dict[str, Any],
    names: list[str],
    reference: list[Any],
    produced: list[Any],
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

    session: Any
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


def _openvino_target(
    options: dict[str, Any] | None, model_file: Any, rtol: float, atol: float, top1_min: float | None = None
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
            error=f"OpenVINO cannot compile the model: {brief(exc, lines=None, limit=400)}",
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


def _openvino_case(
    target: _OpenVino,
    feeds: dict[str, Any],
    names: list[str],
    reference: list[Any],
    produced: list[Any],
    top1_gated: bool,
    keep: Callable[[str, Any], Any],
) -> OpenVinoResult:
    """One validation case in OpenVINO, with its precision's tolerances; top-1 agreement for language models."""
    import numpy as np

    try:
        got = {n: keep(n, v) for n, v in zip(names, target.session.run(names, feeds), strict=True)}
    except Exception as exc:
        return {
            "passed": False,
            "error": f"OpenVINO refused the inputs: {brief(exc, lines=None, limit=400)}",
            "outputs": {},
            "max_abs_diff_vs_cpu": None,
            "top1_agreement": None,
        }
    case = _runtime_case("OpenVINO", got, names, reference, produced, target.rtol, target.atol)
    top1 = None
    if top1_gated and names[0] in got and np.shape(got[names[0]]) == reference[0].shape:
        top1 = float((np.asarray(got[names[0]]).argmax(-1) == reference[0].argmax(-1)).mean())
    return {**case, "top1_agreement": top1}


def json_safe(data: Any) -> Any:
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


def mean_pool(hidden: Any, mask: Any) -> Any:
    """Mean of ``hidden`` [batch, sequence, width] over the positions where ``mask`` [batch, sequence] is set.

    As sentence-transformers pools: padding does not count, and an all-padding row gives zeros.
    """
    import numpy as np

    weights = np.asarray(mask, dtype=np.float64)[..., None]
    total = (np.asarray(hidden, dtype=np.float64) * weights).sum(axis=1)
    return total / np.maximum(weights.sum(axis=1), 1e-9)


def cosine_rows(a: Any, b: Any) -> Any:
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
    return np.clip(cos, -1.0, 1.0)


def _accuracy(cfg: AccuracyCheck, wrapped: Any, session: Any, export: ExportSection, recipe_dir: Any) -> AccuracyResult:
    """Top-1 accuracy of the first output through PyTorch and ONNX Runtime, in batches."""
    import numpy as np

    key = "validate.accuracy.dataset"
    from onnxbuild.sources.usercode import load_function

    fn = load_function(cfg["dataset"], recipe_dir, key)
    try:
        got = fn()
    except Exception as exc:
        raise StepError(f"{key}: {cfg['dataset']} raised {type(exc).__name__}: {str(exc)[:300]}") from None
    feeds, labels = labelled_inputs(got, export["inputs"], key)
    if labels.shape[0] == 0:
        raise StepError(f"{key}: {cfg['dataset']} returned no samples")
    names = [t["name"] for t in export["inputs"]]
    first = export["outputs"][0]
    size = int(cfg["batch_size"])
    torch_pred, ort_pred = [], []
    for start in range(0, labels.shape[0], size):
        batch = {n: feeds[n][start : start + size] for n in names}
        ref, out = _first_output_both(
            wrapped, session, export, batch, f"{key}: ONNX Runtime refused the dataset's inputs"
        )
        want = labels[start : start + size]
        if ref.shape[:-1] != want.shape:
            raise StepError(
                f"{key}: labels must be shaped like output {first} without its last (class) axis: "
                f"{list(ref.shape[:-1])} for samples {start}..{start + len(want) - 1}, got {list(want.shape)}"
            )
        torch_pred.append(ref.argmax(-1))
        ort_pred.append(out.argmax(-1))
    t, o = np.concatenate(torch_pred), np.concatenate(ort_pred)
    pytorch, onnxruntime = float((t == labels).mean()), float((o == labels).mean())
    max_drop, floor = float(cfg["max_drop"]), cfg.get("min")
    passed = pytorch - onnxruntime <= max_drop + 1e-9 and (floor is None or onnxruntime >= float(floor))
    return {
        "dataset": cfg["dataset"],
        "samples": int(labels.shape[0]),
        "pytorch": pytorch,
        "onnxruntime": onnxruntime,
        "agreement": float((t == o).mean()),
        "max_drop": max_drop,
        "min": None if floor is None else float(floor),
        "passed": bool(passed),
    }


def _first_output_both(
    wrapped: Any, session: Any, export: ExportSection, feeds: dict[str, Any], refused: str
) -> tuple[Any, Any]:
    """The first output from PyTorch and from ONNX Runtime on the same inputs (numpy arrays)."""
    import numpy as np
    import torch

    names = [t["name"] for t in export["inputs"]]
    with torch.no_grad():
        ref = wrapped(*(torch.from_numpy(feeds[n]) for n in names))[0].detach().float().cpu().numpy()
    try:
        got = np.asarray(session.run([export["outputs"][0]], feeds)[0])
    except Exception as exc:
        raise StepError(f"{refused}: {brief(exc, lines=None, limit=500)}{_fixed_axis_hint(export, feeds)}") from None
    return ref, got


def _embeddings(
    feeds: dict[str, Any], mask: Any, cosine_min: float | None, wrapped: Any, session: Any, export: ExportSection
) -> EmbeddingResult:
    """Sentence embeddings from the first output, ONNX Runtime against PyTorch by cosine similarity."""
    import numpy as np

    first = export["outputs"][0]
    ref, got = _first_output_both(
        wrapped, session, export, feeds, "validate.sentences: ONNX Runtime refused the tokenized sentences"
    )
    if got.shape != ref.shape:
        raise StepError(
            f"validate.sentences: output {first} has shape {list(got.shape)} from ONNX Runtime but {list(ref.shape)} "
            "from PyTorch"
        )
    pooling: Literal["mean", "none"]
    if ref.ndim == 3 and ref.shape[:2] == mask.shape:
        pooling, a, b = "mean", mean_pool(ref, mask), mean_pool(got, mask)
    elif ref.ndim == 2:
        pooling, a, b = "none", ref.astype(np.float64), got.astype(np.float64)
    else:
        raise StepError(
            f"validate.sentences: output {first} has shape {list(ref.shape)}; "
            "sentence embeddings need [batch, sequence, width] (mean-pooled) or [batch, width]"
        )
    cos = cosine_rows(a, b)
    threshold = None if cosine_min is None else float(cosine_min)
    return {
        "sentences": int(mask.shape[0]),
        "sequence": int(mask.shape[1]),
        "pooling": pooling,
        "min": float(np.min(cos)),
        "mean": float(np.mean(cos)),
        "worst_sentence": int(np.argmin(np.nan_to_num(cos, nan=-np.inf))),
        "max_abs_diff": float(np.abs(a - b).max()),
        "cosine_min": threshold,
        "passed": threshold is None or bool(np.all(cos >= threshold)),
    }


def _fixed_axis_hint(export: ExportSection, feeds: dict[str, Any]) -> str:
    for t in export["inputs"]:
        fixed = [i for i, d in enumerate(t["shape"]) if isinstance(d, int)]
        for i in fixed:
            if t["name"] in feeds and i < feeds[t["name"]].ndim and feeds[t["name"]].shape[i] != t["shape"][i]:
                return (
                    f" (export.inputs declares {t['name']} axis {i} fixed at {t['shape'][i]}; "
                    "name it, e.g. sequence, to make it dynamic)"
                )
    return ""


LEFT_OUT = "no left-padded batch validated (validate.left_padding: false)"


def case_seed(validate: ValidateSection, export: ExportSection, sizes: dict[str, int]) -> int | None:
    """The seed validation made ``sizes``' inputs with (validate.seed + the case's index),
    or None when validation runs no such case."""
    if export.get("with_past") and "past_sequence" not in sizes:
        sizes = {**sizes, "past_sequence": 0}
    return next(
        (int(validate["seed"]) + i for i, c in enumerate(validation_cases(validate, export)) if c == sizes), None
    )


def validation_cases(validate: ValidateSection, export: ExportSection) -> list[dict[str, int]]:
    """The cases a recipe's validation runs, in order (case i's inputs are seeded validate.seed + i)."""
    padded = _free_batch(export) and validate.get("left_padding", True)
    return cases(validate["shapes"], bool(export.get("with_past")), padded=padded)


def _free_batch(export: ExportSection) -> bool:
    """Whether the export takes an attention_mask with a free batch axis (a left-padded case
    needs both: the mask to pad, two rows)."""
    return any(
        t["name"] == "attention_mask" and t["shape"] and isinstance(t["shape"][0], str) for t in export["inputs"]
    )


def _again(validate: ValidateSection, shape: dict[str, int]) -> str:
    """explain-mismatch's options for a left-padded case (the recipe shape its prefill came from)."""
    if not shape.get("left_padding"):
        return ""
    length = shape["sequence"] if not shape.get("past_sequence") else shape["past_sequence"]
    index = next(
        (i for i, s in enumerate(validate["shapes"]) if s.get("sequence") == length and "past_sequence" not in s), 0
    )
    return f" --shape {index} --left-padding {shape['left_padding']}"
