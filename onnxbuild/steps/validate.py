"""The ``validate`` step: ONNX Runtime against the source model at several input shapes.

Tolerances follow numpy.allclose: an element mismatches when
``|onnx - torch| > atol + rtol * |torch|``; both are explicit in the recipe (numpy's
hidden rtol=1e-5 default is how Optimum lets "max diff exceeds atol" through). A
failure fails the build unless the recipe says ``on_fail: warn``.

The record types and the Markdown are in report/validation.py; the kind (its plan, run
and report) is here, and its parts are in steps/validating/: ``compare`` (the tolerance
rule, pooling, cosine), ``cases`` (shapes, padding, seeds, real tokens), ``targets`` (one
case on ONNX Runtime, onnxruntime-web, OpenVINO) and ``checks`` (accuracy, embeddings, the
first-divergence search). What remains here (~670 lines) is the kind's plan, its run over
the cases and targets, and its verdict and report: one flow, whose parts already live there.

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

from typing import TYPE_CHECKING, TypedDict, cast

from onnxbuild._util import brief, pick, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.quant import u8s8, weightcheck
from onnxbuild.quant.weightcheck import WeightCheck
from onnxbuild.recipe.sections import (
    ExportSection,
    Tensor,
    ValidateSection,
    target_variants,
)
from onnxbuild.recipe.variants import SOURCE_RECORD, TEXT_GATES
from onnxbuild.report.validation import (
    AccuracyResult,
    EmbeddingResult,
    OpenVinoVerdict,
    ShapeResult,
    TextQuality,
    failure_message,
    markdown,
    numeric_failure,
    text_summary,
)
from onnxbuild.runtimes import openvino_target, sessions
from onnxbuild.runtimes.sessions import Session
from onnxbuild.sources import section_for, source_kind
from onnxbuild.sources.checkpoint import replace_weights
from onnxbuild.sources.torchmodel import (
    full_export,
    gates_top1,
    input_specs,
    load_source_model,
    load_tokenizer,
    make_inputs,
    sentence_inputs,
    vocab_size,
    wrap,
)
from onnxbuild.spec import Branch, Planning, StepInput, StepKind
from onnxbuild.steps import text_quality
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, read_source_record
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.validating import graphcheck, rules
from onnxbuild.steps.validating.cases import (
    LEFT_OUT,
    RealTokens,
    fixed_axis_hint,
    free_batch,
    validation_cases,
)
from onnxbuild.steps.validating.checks import accuracy_check, divergence_check, embedding_check
from onnxbuild.steps.validating.compare import as_declared, compare, json_safe
from onnxbuild.steps.validating.graphcheck import GraphCheck
from onnxbuild.steps.validating.targets import OpenVinoOptions, openvino_case, openvino_target_for, web_case

if TYPE_CHECKING:
    import numpy as np
    import torch
    from numpy.typing import NDArray

    from onnxbuild.recipe.model import Recipe


WEIGHT_ROUNDED = ("int8", "int4")
"""Precisions whose graph is also checked on their own dequantized weights (validating/graphcheck.py)."""

RANDOM_INIT_REPORTED = ("int8", "int4")
"""Precisions whose default top-1 floor is reported, not gated, on random-init weights."""
RANDOM_INIT_TOP1 = (
    "reported, not gated: random-init weights give near-flat logits, where 4- and 8-bit rounding "
    "flips argmaxes of a right graph (17 of 54 tiny architectures failed the 0.85 floor on them); "
    "the logits' tolerances still gate, and a recipe's own top1_min is gated as given"
)


PACKAGES = ("torch", "transformers", "tokenizers", "onnxruntime", "numpy", "openvino")


MEMORY = (0.9, 1850)
"""Peak as (x the fp32 weights, MB more), measured: GPT-2 small 2.3 GB; a Llama-3.2-1B shape
(4.94 GB of weights): 6.3 GB for the fp32 file, 5.1 and 4.4 for its 8- and 4-bit variants with
their graph checks (validating/graphcheck.py: one session at a time there too).
PyTorch's outputs come first and its model is freed before ONNX Runtime loads the file (at 1B
and up its layers are read as they run: sources/checkpoint.streamed_model); the weights check
runs before the session. Before: 10.8, 12.3 and 14.6 GB, all of them held together."""

QUANTIZED_MEMORY = (0.4, 1850)
"""Where the export itself is 4- or 8-bit (export.weights: no float file), of the fp32 weights:
the session holds the quantized weights and PyTorch streams its layers (a 3B shape: 5.0 GB
with the graph check)."""


def memory(recipe: Recipe) -> tuple[float, int]:
    return MEMORY if export_kind.model_precision(recipe) == "fp32" else QUANTIZED_MEMORY


class BaseVariant(TypedDict):
    """The file a variant was made from, where a failed validation looks for where they part."""

    variant: str
    path: str


class _ValidateNamed(TypedDict):
    source: dict[str, dict[str, object]]
    export: dict[str, object] | None
    """The export's signature (``export_kind.signature``): None for a source that is not traced."""
    validate: ValidateSection
    variant: str
    model_path: str


class ValidateParams(_ValidateNamed, total=False):
    """What :func:`plan` puts in the step's params."""

    files: list[str]
    prefill_path: str
    web: bool
    openvino: OpenVinoOptions
    base: BaseVariant
    top1_default: bool
    graph_check: GraphTolerances


class GraphTolerances(TypedDict):
    """The fp32 tolerances a weight-only variant's graph is held to on its own dequantized weights."""

    rtol: float
    atol: float


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
        validate = r["validate"] | rules.tolerances(p.recipe, v)
        if not validate.get("sentences"):  # the embedding floor applies to sentences only
            validate = pick(validate, set(validate) - {"cosine_min"})
        if not validate.get("text"):  # and the text gates to text: out of the key without it
            validate = pick(validate, set(validate) - {"text", *TEXT_GATES})
        traced = export_kind.section(r)
        if validate.get("left_padding", True) or not (traced and traced["with_past"]):
            # in the key only where it leaves the case out: the default reruns nothing built before it
            validate = pick(validate, set(validate) - {"left_padding"})
        params = {
            "source": source,
            **export_kind.signature(r),
            "validate": validate,
            "variant": v.name,
            "model_path": v.path,
        }
        if v.files:
            params["files"] = list(v.files)
        if v.prefill:
            params["prefill_path"] = v.prefill
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
        if v.precision in WEIGHT_ROUNDED and not v.files:  # its graph, apart from its rounding
            params["graph_check"] = {"rtol": float(r["validate"]["rtol"]), "atol": float(r["validate"]["atol"])}
        if v.precision in RANDOM_INIT_REPORTED and validate.get("top1_min") is not None and "top1_min" not in v.own:
            params["top1_default"] = True  # the precision's default floor: gated on trained weights only
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


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import numpy as np
    import onnxruntime as ort
    import torch

    params = cast(ValidateParams, spec.params)  # the JSON plan() built
    source, export = params["source"], export_kind.required(params)
    validate = params["validate"]
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir)
    if params.get("files"):
        from onnxbuild.steps.validating import seq2seq, vlm

        ((kind, src),) = source.items()
        validate_files = vlm.validate_files if source_kind(kind).vlm(src) else seq2seq.validate_files
        checked = validate_files(model, source, export, validate, [ctx.input(f) for f in params["files"]], compare)
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

    # PyTorch's outputs for every case first, then its model freed before ONNX Runtime loads the
    # file: the two are never held together (a 1B model: 4.9 GB each), unless a later check
    # (accuracy, sentences, text) runs the model again
    cases = []
    for i, sizes in enumerate(validation_cases(validate, export)):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        real = RealTokens.of(feeds, sizes)
        try:
            with torch.no_grad():
                reference = [
                    real.keep(n, t.detach().float().cpu().numpy())
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
        cases.append((sizes, feeds, real, reference))
    later = validate["accuracy"] is not None or bool(validate["sentences"]) or bool(validate.get("text"))
    model_file = ctx.input(params.get("model_path", "model.onnx"))
    # PyTorch on the variant's own dequantized weights (validating/graphcheck.py), its float
    # weights put back after where a later check needs them
    graph_plan = params.get("graph_check")
    graph_refs: list[list[NDArray[np.generic]]] = []
    graph: GraphCheck | None = None
    made, matmuls, unchecked = graphcheck.replacements(model_file, model) if graph_plan else ({}, 0, "")
    if graph_plan is not None and unchecked:
        graph = graphcheck.skipped(unchecked, graph_plan["rtol"], graph_plan["atol"])
    elif made:
        restore = replace_weights(model, made, restorable=later)
        with torch.no_grad():
            for _, feeds, real, _ in cases:
                out = wrapped(*(torch.from_numpy(feeds[n]) for n in names))
                graph_refs.append(
                    [
                        real.keep(n, t.detach().float().cpu().numpy())
                        for n, t in zip(export["outputs"], out, strict=False)
                    ]
                )
        restore()
    if not later:
        import gc

        del model, wrapped
        model = wrapped = None
        gc.collect()

    # the file's own checks, one tensor at a time, before a session holds its weights
    kernels = u8s8.note(model_file)
    base = params.get("base")
    weights = weightcheck.check(model_file, ctx.input(base["path"])) if base else None
    if weights is not None and not weights["checked"] and not weights["not_checked"]:
        weights = None  # nothing quantized in it (fp16): no check to report

    options = sessions.options()
    provider = "CPUExecutionProvider"
    try:
        session = ort.InferenceSession(
            str(ctx.input(params.get("model_path", "model.onnx"))), options, providers=[provider]
        )
    except Exception as exc:
        raise StepError(f"ONNX Runtime cannot load model.onnx: {brief(exc, lines=None, limit=500)}") from None

    # a variant served by two files (steps/serve.py) runs a prompt, from an empty past, on its
    # prefill file and every later step on its decode file, as onnxruntime-genai and run do
    prefill = (
        ort.InferenceSession(str(ctx.input(params["prefill_path"])), options, providers=[provider])
        if params.get("prefill_path")
        else None
    )
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    results: list[ShapeResult] = []
    web_target = bool(params.get("web"))
    web_note = ""
    if web_target:
        from onnxbuild import web

        why = web.unavailable()
        if why:
            web_target, web_note = False, f"web target skipped: {why}"
        else:
            where = f", installed in {web.where()}" if web.where() else ""
            web_note = f"also validated in onnxruntime-web {web.version()} (wasm, Node.js{where})"
    ov_target = openvino_target_for(params.get("openvino"), model_file, rtol, atol, validate.get("top1_min"))
    ov_hits = ov_total = 0
    # Top-1 agreement gates over every token of every shape together: a shape of 8 tokens
    # alone moves in steps of 12.5%, too coarse to hold a quantized model to 0.85.
    top1_hits = top1_total = 0
    failing: dict[str, NDArray[np.generic]] | None = None  # the first numeric failure's inputs, for the search
    runs: Session | None = None
    for sizes, feeds, real, reference in cases:
        keep = real.keep
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
            runs = prefill if prefill is not None and not sizes.get("past_sequence") else session
            whole = [
                np.asarray(o, np.float32) if getattr(o, "dtype", None) == np.float16 else o
                for o in runs.run(export["outputs"], as_declared(runs, feeds))
            ]
            produced = [keep(n, p) for n, p in zip(export["outputs"], whole, strict=True)]
        except Exception as exc:
            shape_result["error"] = (
                f"ONNX Runtime refused the inputs: {brief(exc, lines=None, limit=500)}{fixed_axis_hint(export, feeds)}"
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
            shape_result["web"] = web_case(model_file, feeds, export["outputs"], reference, produced, rtol, atol, keep)
            ok = ok and shape_result["web"]["passed"]
        if ov_target is not None and ov_target.session is not None:
            case = openvino_case(ov_target, feeds, export["outputs"], reference, produced, top1_gated, keep)
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
        accuracy_check(validate["accuracy"], wrapped, session, export, ctx.recipe_dir)
        if validate["accuracy"] is not None
        else None
    )
    embeddings = None
    if validate["sentences"]:
        tokenizer = load_tokenizer(source, record, ctx.recipe_dir)
        feeds, mask = sentence_inputs(tokenizer, validate["sentences"], specs, validate["shapes"][0])
        embeddings = embedding_check(feeds, mask, validate.get("cosine_min"), wrapped, session, export)

    text = (
        _text_quality(ctx, model, session, source, record, export, specs, validate, prefill)
        if validate.get("text")
        else None
    )
    openvino = ov_target.report(results, ov_hits, ov_total) if ov_target is not None else None
    if graph_refs and graph_plan is not None:
        # one session at a time: the float-compute one holds the same weights (a 3B model's
        # int4 file: 8.3 GB with both, where each alone took 4.7 and 3.3)
        del session, prefill, runs
        graph = graphcheck.compared(
            model_file,
            [(sizes, feeds, real.keep) for sizes, feeds, real, _ in cases],
            graph_refs,
            export["outputs"],
            matmuls,
            graph_plan["rtol"],
            graph_plan["atol"],
        )
    left_out = bool(export.get("with_past")) and free_batch(export) and not validate.get("left_padding", True)
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
        kernels,
        weights,
        graph,
    )


def _text_quality(
    ctx: StepContext,
    model: torch.nn.Module,
    session: Session,
    source: dict[str, dict[str, object]],
    record: dict[str, object],
    export: ExportSection,
    specs: list[Tensor],
    validate: ValidateSection,
    prefill: Session | None = None,
) -> TextQuality:
    """validate.text through the variant's session: each window one prefill from an empty past;
    for a variant served by two files, the first half of each window prefilled by its prefill
    file and the rest decoded one token at a time by its decode file, as it serves them."""
    import numpy as np

    from onnxbuild.runtimes.decoding import OrtDecoder

    text = validate["text"]
    assert text is not None
    tokenizer = load_tokenizer(source, record, ctx.recipe_dir, key="validate.text")
    windows = text_quality.token_windows(tokenizer, text_quality.read_text(text, ctx.recipe_dir), text)
    first = export["outputs"][0]

    def run_onnx(ids: NDArray[np.int64]) -> NDArray[np.generic]:
        feeds = make_inputs(specs, {"batch": 1, "sequence": ids.shape[1], "past_sequence": 0}, seed=0, vocab=None)
        feeds["input_ids"] = ids.astype(feeds["input_ids"].dtype)
        return np.asarray(session.run([first], feeds)[0])

    gates: dict[str, float | None] = {g: validate.get(g) for g in TEXT_GATES}
    if prefill is None:
        return text_quality.measure(model, run_onnx, windows, text, gates)
    decoder = OrtDecoder(session, prefill=prefill)

    def served(ids: NDArray[np.int64]) -> NDArray[np.float32]:
        return decoder.logits_as_served(ids, ids.shape[1] // 2)

    how = (
        f"served: each window's first {windows.shape[1] // 2} tokens prefilled by the prefill file, "
        "the rest decoded one token at a time by the decode file"
    )
    return text_quality.measure(model, served, windows, text, gates, how)


def _finish(
    ctx: StepContext,
    spec: StepSpec,
    record: dict[str, object],
    source: dict[str, dict[str, object]],
    validate: ValidateSection,
    results: list[ShapeResult],
    top1_hits: int,
    top1_total: int,
    accuracy: AccuracyResult | None,
    embeddings: EmbeddingResult | None,
    web_note: str,
    provider: str = "CPUExecutionProvider",
    openvino: OpenVinoVerdict | None = None,
    left_out: bool = False,
    failing: dict[str, NDArray[np.generic]] | None = None,
    text: TextQuality | None = None,
    kernels: str | None = None,
    weights: WeightCheck | None = None,
    graph: GraphCheck | None = None,
) -> StepResult:
    """The verdict, the report files and the step's summary (``left_out``: the recipe turned
    the left-padded case off, which the report and summary say; ``failing``: the inputs of
    the first case that failed numerically, which the first-divergence search reruns)."""
    params = cast(ValidateParams, spec.params)  # the JSON plan() built
    variant = params.get("variant", "model")
    framework = source_kind(next(iter(source))).framework  # what ONNX Runtime is compared against
    warn_only = validate["on_fail"] == "warn"  # part of every verdict: whether a failure ends the step
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    top1_min = validate.get("top1_min")  # the variant's floor, as its report records it
    reported = record.get("weights") == "random-init" and bool(spec.params.get("top1_default"))
    gate = None if reported else top1_min
    top1 = (
        {
            "agreement": top1_hits / top1_total,
            "tokens": top1_total,
            "min": gate,
            "passed": gate is None or top1_hits / top1_total >= float(gate),
            **({"note": RANDOM_INIT_TOP1} if reported else {}),
        }
        if top1_total
        else None
    )
    passed = (
        all(r["passed"] for r in results)
        and all(c is None or c["passed"] for c in (accuracy, embeddings, top1, text))
        and (openvino is None or openvino["passed"])
        and (weights is None or weights["passed"])
        and (graph is None or graph["passed"] is not False)
    )
    report = {
        "passed": passed,
        "weights": record.get("weights"),
        "weights_note": record.get("why", ""),
        "reference": framework.lower(),
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
                "int8_kernels": kernels,
                "weights": weights,
                "graph_check": graph,
            }
        },
    }
    # One file per variant; the report step merges them into reports/validation.json and .md.
    ctx.output(f"reports/validation/{variant}.json").write_text(pretty_json(json_safe(report)), encoding="utf-8")
    ctx.output(f"reports/validation/{variant}.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
    worst = max((c["max_abs_diff"] or 0.0 for r in results for c in r["outputs"].values()), default=0.0)
    summary = f"{'passed' if passed else 'FAILED'} at {len(results)} shapes, max abs diff {worst:.2e}"
    data: dict[str, object] = {"passed": passed, "max_abs_diff": worst, "shapes": len(results)}
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
        summary += f", accuracy {accuracy['onnxruntime']:.4f} ({framework} {accuracy['pytorch']:.4f})"
        data["accuracy"] = {"pytorch": accuracy["pytorch"], "onnxruntime": accuracy["onnxruntime"]}
    if embeddings is not None:
        summary += f", embedding cosine min {embeddings['min']:.6f}"
        data["embedding_cosine_min"] = embeddings["min"]
    if text is not None:
        summary += f"; on text: {text_summary(text)}"
        data["text"] = {
            k: text[k] for k in ("perplexity", "perplexity_reference", "ppl_increase", "kld_mean", "top1_agreement")
        }
    if weights is not None and weights["worst"] is not None:
        w = weights["worst"]
        summary += f"; weights check: {weights['checked']} tensors, worst relative error {w['rel_error']:.3f}"
        data["weights_checked"] = weights["checked"]
    if graph is not None:
        summary += f"; graph check: {graph['note']}"
        data["graph_check"] = {"passed": graph["passed"], "max_abs_diff": graph["max_abs_diff"]}
    if kernels:
        summary += f"; {kernels}"
        data["int8_kernels"] = kernels
    if left_out:
        summary += f"; {LEFT_OUT}"
    if record.get("weights") == "random-init":
        summary += ", weights: random-init"
    data = json_safe(data)
    if passed:
        return StepResult(summary=summary, data=data)
    message = failure_message(
        results,
        variant,
        accuracy=accuracy,
        embeddings=embeddings,
        top1=top1,
        openvino=openvino,
        text=text,
        weights=weights,
        base=(spec.params.get("base") or {}).get("variant"),
    )
    if graph is not None and graph["passed"] is False:
        message += (
            f"; its graph is wrong, not only its rounding: {graph['note']} (a bug in the quantizer or the "
            "exporter, not in the recipe: report it)"
        )
    if warn_only:
        return StepResult(summary=summary, data=data, warnings=(message + " (validate.on_fail: warn)",))
    numeric = numeric_failure(results)
    hint = " Loosen validate.atol/rtol only if the difference is expected." if numeric else ""
    if numeric and params.get("base") and failing is not None:
        hint += divergence_check(ctx, spec, results, validate, failing)
    raise StepError(f"{message}. Reports: artifacts/{ctx.recipe_name}/failed/{spec.name}/.{hint}")


KIND = StepKind(
    name="validate",
    packages=PACKAGES,
    branches=(Branch(lambda params: "openvino" in params, packages=("openvino",)),),
    plan=plan,
    run=run,
    memory=MEMORY,
    memory_for=memory,
    imports=("onnxruntime",),
    loads_model=True,
    check=rules.check,
    resolve=rules.resolve,
    each_variant=True,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
