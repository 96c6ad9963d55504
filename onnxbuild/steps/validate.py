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

from dataclasses import dataclass
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
    from collections.abc import Callable, Sequence
    from pathlib import Path

    import numpy as np
    import torch
    from numpy.typing import NDArray
    from transformers import PreTrainedModel

    from onnxbuild.recipe.model import Recipe


PROVIDER = "CPUExecutionProvider"
"""The provider every variant is validated on (other targets beside it: web, OpenVINO)."""
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


@dataclass
class Found:
    """What one validation gathered, for the verdict (:func:`_finish`)."""

    results: list[ShapeResult]
    top1_hits: int = 0
    top1_total: int = 0
    """Top-1 agreement gates over every token of every shape together: a shape of 8 tokens alone
    moves in steps of 12.5%, too coarse to hold a quantized model to 0.85."""
    accuracy: AccuracyResult | None = None
    embeddings: EmbeddingResult | None = None
    web_note: str = ""
    provider: str = "CPUExecutionProvider"
    openvino: OpenVinoVerdict | None = None
    left_out: bool = False
    """The recipe turned the left-padded case off, which the report and summary say."""
    failing: dict[str, NDArray[np.generic]] | None = None
    """The inputs of the first case that failed numerically, which the first-divergence search reruns."""
    text: TextQuality | None = None
    kernels: str | None = None
    weights: WeightCheck | None = None
    graph: GraphCheck | None = None


Case = tuple[dict[str, int], dict[str, "NDArray[np.generic]"], RealTokens, list["NDArray[np.generic]"]]
"""One validation shape: its sizes, its inputs, which tokens are real, PyTorch's outputs."""


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    params = cast(ValidateParams, spec.params)  # the JSON plan() built
    source, export = params["source"], export_kind.required(params)
    validate = params["validate"]
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir)
    if params.get("files"):
        return _validate_files(ctx, spec, model, record)
    export = full_export(export, model)
    names = [t["name"] for t in export["inputs"]]
    wrapped = wrap(model, source, names, export["outputs"])
    specs = input_specs(source, export, natural=True)
    # PyTorch's outputs for every case first, then its model freed before ONNX Runtime loads the
    # file: the two are never held together (a 1B model: 4.9 GB each), unless a later check
    # (accuracy, sentences, text) runs the model again
    cases = _reference_cases(wrapped, validate, export, specs, names, vocab_size(model))
    later = validate["accuracy"] is not None or bool(validate["sentences"]) or bool(validate.get("text"))
    model_file = ctx.input(params.get("model_path", "model.onnx"))
    graph_plan = params.get("graph_check")
    graph_refs, graph, matmuls = _graph_references(model_file, model, wrapped, cases, names, export, graph_plan, later)
    if not later:
        import gc

        del model, wrapped
        model = wrapped = None
        gc.collect()

    kernels, weights = _file_checks(ctx, params, model_file)
    session, prefill = _sessions(ctx, params, model_file)
    web_target, web_note = _web_target(params)
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    ov_target = openvino_target_for(params.get("openvino"), model_file, rtol, atol, validate.get("top1_min"))
    found = Found(results=[], web_note=web_note, provider=PROVIDER, kernels=kernels, weights=weights, graph=graph)
    top1_gated = gates_top1(source)
    ov_counts = [0, 0]  # OpenVINO's top-1 hits and tokens over every shape
    for sizes, feeds, real, reference in cases:
        shape_result, produced = _one_case(
            (session, prefill), sizes, feeds, real, reference, export, rtol, atol, top1_gated, found
        )
        if produced is not None:
            if web_target:
                shape_result["web"] = web_case(
                    model_file, feeds, export["outputs"], reference, produced, rtol, atol, real.keep
                )
                shape_result["passed"] = shape_result["passed"] and shape_result["web"]["passed"]
            if ov_target is not None and ov_target.session is not None:
                case = openvino_case(ov_target, feeds, export["outputs"], reference, produced, top1_gated, real.keep)
                shape_result["openvino"] = case
                shape_result["passed"] = shape_result["passed"] and case["passed"]
                if case["top1_agreement"] is not None:
                    ov_counts[0] += round(case["top1_agreement"] * reference[0][..., 0].size)
                    ov_counts[1] += reference[0][..., 0].size
            if not shape_result["passed"] and found.failing is None:
                found.failing = feeds
        found.results.append(shape_result)

    if validate["accuracy"] is not None:
        found.accuracy = accuracy_check(validate["accuracy"], wrapped, session, export, ctx.recipe_dir)
    if validate["sentences"]:
        tokenizer = load_tokenizer(source, record, ctx.recipe_dir)
        feeds, mask = sentence_inputs(tokenizer, validate["sentences"], specs, validate["shapes"][0])
        found.embeddings = embedding_check(feeds, mask, validate.get("cosine_min"), wrapped, session, export)
    if validate.get("text"):
        found.text = _text_quality(ctx, model, session, source, record, export, specs, validate, prefill)
    found.openvino = ov_target.report(found.results, *ov_counts) if ov_target is not None else None
    if graph_refs and graph_plan is not None:
        # one session at a time: the float-compute one holds the same weights (a 3B model's
        # int4 file: 8.3 GB with both, where each alone took 4.7 and 3.3)
        del session, prefill
        found.graph = graphcheck.compared(
            model_file,
            [(sizes, feeds, real.keep) for sizes, feeds, real, _ in cases],
            graph_refs,
            export["outputs"],
            matmuls,
            graph_plan["rtol"],
            graph_plan["atol"],
        )
    found.left_out = bool(export.get("with_past")) and free_batch(export) and not validate.get("left_padding", True)
    return _finish(ctx, spec, record, found)


def _validate_files(ctx: StepContext, spec: StepSpec, model: PreTrainedModel, record: dict[str, object]) -> StepResult:
    """A variant of several files (an encoder-decoder, a vision-language model): validated by
    its layout's own loop (validating/seq2seq.py, validating/vlm.py)."""
    from onnxbuild.steps.validating import seq2seq, vlm

    params = cast(ValidateParams, spec.params)
    source, export = params["source"], export_kind.required(params)
    ((kind, src),) = source.items()
    validate_files = vlm.validate_files if source_kind(kind).vlm(src) else seq2seq.validate_files
    files = [ctx.input(f) for f in params["files"]]
    checked = validate_files(model, source, export, params["validate"], files, compare)
    found = Found(
        results=[cast(ShapeResult, c) for c in checked.results],
        top1_hits=checked.top1_hits,
        top1_total=checked.top1_total,
    )
    return _finish(ctx, spec, record, found)


def _reference_cases(
    wrapped: Callable[..., Sequence[torch.Tensor]],
    validate: ValidateSection,
    export: ExportSection,
    specs: list[Tensor],
    names: list[str],
    vocab: int | None,
) -> list[Case]:
    """Every validation shape's inputs and PyTorch's outputs on them (of the real tokens only)."""
    import torch

    cases: list[Case] = []
    for i, sizes in enumerate(validation_cases(validate, export)):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        real = RealTokens.of(feeds, sizes)
        try:
            with torch.no_grad():
                outputs = wrapped(*(torch.from_numpy(feeds[n]) for n in names))
                reference = [
                    real.keep(n, t.detach().float().cpu().numpy())
                    for n, t in zip(export["outputs"], outputs, strict=False)
                ]
        except Exception as exc:  # the source model itself refuses this shape: the recipe asks too much
            shown = ", ".join(f"{d}={v}" for d, v in sizes.items())
            raise StepError(
                f"validate.shapes: PyTorch itself fails on the source model at {shown} ({type(exc).__name__}: "
                f"{brief(exc, limit=300)}); "
                "the model does not take inputs of that size: list sizes it takes under validate.shapes"
            ) from None
        cases.append((sizes, feeds, real, reference))
    return cases


def _graph_references(
    model_file: Path,
    model: torch.nn.Module,
    wrapped: Callable[..., Sequence[torch.Tensor]],
    cases: list[Case],
    names: list[str],
    export: ExportSection,
    graph_plan: GraphTolerances | None,
    later: bool,
) -> tuple[list[list[NDArray[np.generic]]], GraphCheck | None, int]:
    """PyTorch's outputs on the variant's own dequantized weights (validating/graphcheck.py),
    the float weights put back after where a later check (``later``) needs them; or why the
    graph check is not run. (references, the check where it is already decided, MatMuls mapped)"""
    import torch

    refs: list[list[NDArray[np.generic]]] = []
    if graph_plan is None:
        return refs, None, 0
    made, matmuls, unchecked = graphcheck.replacements(model_file, model)
    if unchecked:
        return refs, graphcheck.skipped(unchecked, graph_plan["rtol"], graph_plan["atol"]), matmuls
    if made:
        restore = replace_weights(model, made, restorable=later)
        with torch.no_grad():
            for _, feeds, real, _ in cases:
                out = wrapped(*(torch.from_numpy(feeds[n]) for n in names))
                refs.append(
                    [
                        real.keep(n, t.detach().float().cpu().numpy())
                        for n, t in zip(export["outputs"], out, strict=False)
                    ]
                )
        restore()
    return refs, None, matmuls


def _file_checks(ctx: StepContext, params: ValidateParams, model_file: Path) -> tuple[str | None, WeightCheck | None]:
    """The file's own checks, one tensor at a time, before a session holds its weights: whether
    its int8 kernels can overflow here (quant/u8s8.py), and its quantized weights against the
    float ones of the file it was made from."""
    kernels = u8s8.note(model_file)
    base = params.get("base")
    weights = weightcheck.check(model_file, ctx.input(base["path"])) if base else None
    if weights is not None and not weights["checked"] and not weights["not_checked"]:
        weights = None  # nothing quantized in it (fp16): no check to report
    return kernels, weights


def _sessions(ctx: StepContext, params: ValidateParams, model_file: Path) -> tuple[Session, Session | None]:
    """The file's session, and its prefill file's where a variant is served by two (steps/serve.py):
    a prompt, from an empty past, runs on the prefill file and every later step on the decode
    file, as onnxruntime-genai and ``onnxbuild run`` do."""
    import onnxruntime as ort

    options = sessions.options()
    try:
        session = ort.InferenceSession(str(model_file), options, providers=[PROVIDER])
    except Exception as exc:
        raise StepError(f"ONNX Runtime cannot load model.onnx: {brief(exc, lines=None, limit=500)}") from None
    prefill = (
        ort.InferenceSession(str(ctx.input(params["prefill_path"])), options, providers=[PROVIDER])
        if params.get("prefill_path")
        else None
    )
    return session, prefill


def _web_target(params: ValidateParams) -> tuple[bool, str]:
    """Whether onnxruntime-web validates this variant too, and the note that says so (or why not)."""
    if not params.get("web"):
        return False, ""
    from onnxbuild import web

    why = web.unavailable()
    if why:
        return False, f"web target skipped: {why}"
    where = f", installed in {web.where()}" if web.where() else ""
    return True, f"also validated in onnxruntime-web {web.version()} (wasm, Node.js{where})"


def _one_case(
    files: tuple[Session, Session | None],
    sizes: dict[str, int],
    feeds: dict[str, NDArray[np.generic]],
    real: RealTokens,
    reference: list[NDArray[np.generic]],
    export: ExportSection,
    rtol: float,
    atol: float,
    top1_gated: bool,
    found: Found,
) -> tuple[ShapeResult, list[NDArray[np.generic]] | None]:
    """One shape on ONNX Runtime against PyTorch's outputs: each output's comparison and its
    top-1 agreement (added to ``found``'s count), and the outputs as run (of the real tokens), for
    the other targets to compare with; None where ONNX Runtime refused the inputs. ``files``: the
    file's session and its prefill file's, which runs a prompt from an empty past (no name in the
    caller holds the one chosen, so ``del session`` there frees it before the graph check)."""
    import numpy as np

    session, prefill = files
    runs = prefill if prefill is not None and not sizes.get("past_sequence") else session

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
            for o in runs.run(export["outputs"], as_declared(runs, feeds))
        ]
        produced = [real.keep(n, p) for n, p in zip(export["outputs"], whole, strict=True)]
    except Exception as exc:
        shape_result["error"] = (
            f"ONNX Runtime refused the inputs: {brief(exc, lines=None, limit=500)}{fixed_axis_hint(export, feeds)}"
        )
        return shape_result, None
    ok = True
    for name, ref, got, full in zip(export["outputs"], reference, produced, whole, strict=False):
        cmp = compare(ref, np.asarray(got), rtol, atol)
        if real.mask is not None and np.shape(ref) == np.shape(got):  # the whole outputs' shapes, not the real tokens'
            cmp["worst_index"] = real.index(name, np.shape(full), cmp["worst_index"])
            cmp["shape_expected"] = cmp["shape_onnx"] = list(np.shape(full))
        shape_result["outputs"][name] = cmp
        ok = ok and cmp["passed"]
    if top1_gated and export["outputs"][0] in shape_result["outputs"]:
        ref, got = reference[0], np.asarray(produced[0])
        if ref.shape == got.shape:
            same = ref.argmax(-1) == got.argmax(-1)
            shape_result["top1_agreement"] = float(same.mean())
            found.top1_hits += int(same.sum())
            found.top1_total += int(same.size)
    shape_result["passed"] = ok
    return shape_result, produced


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

    from onnxbuild.layouts.decoding import OrtDecoder

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


def _finish(ctx: StepContext, spec: StepSpec, record: dict[str, object], found: Found) -> StepResult:
    """The verdict, the report files and the step's summary; a failure raises (or warns, with
    ``validate.on_fail: warn``) with what failed and, for a numeric failure of a variant, where
    it first parts from the file it was made from."""
    params = cast(ValidateParams, spec.params)  # the JSON plan() built
    validate = params["validate"]
    warn_only = validate["on_fail"] == "warn"  # part of every verdict: whether a failure ends the step
    variant = params.get("variant", "model")
    top1 = _top1(found, validate, record, bool(params.get("top1_default")))
    passed = (
        all(r["passed"] for r in found.results)
        and all(c is None or c["passed"] for c in (found.accuracy, found.embeddings, top1, found.text))
        and (found.openvino is None or found.openvino["passed"])
        and (found.weights is None or found.weights["passed"])
        and (found.graph is None or found.graph["passed"] is not False)
    )
    framework = source_kind(next(iter(params["source"]))).framework  # what ONNX Runtime is compared against
    report = {
        "passed": passed,
        "weights": record.get("weights"),
        "weights_note": record.get("why", ""),
        "reference": framework.lower(),
        "variants": {
            variant: {
                "passed": passed,
                "provider": found.provider,
                "rtol": float(validate["rtol"]),
                "atol": float(validate["atol"]),
                "top1_min": validate.get("top1_min"),  # the variant's floor, as its report records it
                "top1": top1,
                "shapes": found.results,
                "accuracy": found.accuracy,
                "embedding_cosine": found.embeddings,
                "text": found.text,
                "web": found.web_note or None,
                "openvino": found.openvino,
                "left_padding": LEFT_OUT if found.left_out else None,
                "int8_kernels": found.kernels,
                "weights": found.weights,
                "graph_check": found.graph,
            }
        },
    }
    # One file per variant; the report step merges them into reports/validation.json and .md.
    ctx.output(f"reports/validation/{variant}.json").write_text(pretty_json(json_safe(report)), encoding="utf-8")
    ctx.output(f"reports/validation/{variant}.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
    summary, data = _summary(found, passed, framework, record)
    if passed:
        return StepResult(summary=summary, data=data)
    message = failure_message(
        found.results,
        variant,
        accuracy=found.accuracy,
        embeddings=found.embeddings,
        top1=top1,
        openvino=found.openvino,
        text=found.text,
        weights=found.weights,
        base=(spec.params.get("base") or {}).get("variant"),
    )
    if found.graph is not None and found.graph["passed"] is False:
        message += (
            f"; its graph is wrong, not only its rounding: {found.graph['note']} (a bug in the quantizer or the "
            "exporter, not in the recipe: report it)"
        )
    if warn_only:
        return StepResult(summary=summary, data=data, warnings=(message + " (validate.on_fail: warn)",))
    numeric = numeric_failure(found.results)
    hint = " Loosen validate.atol/rtol only if the difference is expected." if numeric else ""
    if numeric and params.get("base") and found.failing is not None:
        hint += divergence_check(ctx, spec, found.results, validate, found.failing)
    raise StepError(f"{message}. Reports: artifacts/{ctx.recipe_name}/failed/{spec.name}/.{hint}")


def _top1(
    found: Found, validate: ValidateSection, record: dict[str, object], default: bool
) -> dict[str, object] | None:
    """Top-1 agreement over every token of every shape, against the variant's floor (reported, not
    gated, for the default floor on random-init weights); None where no output is gated."""
    if not found.top1_total:
        return None
    reported = record.get("weights") == "random-init" and default
    gate = None if reported else validate.get("top1_min")
    agreement = found.top1_hits / found.top1_total
    return {
        "agreement": agreement,
        "tokens": found.top1_total,
        "min": gate,
        "passed": gate is None or agreement >= float(gate),
        **({"note": RANDOM_INIT_TOP1} if reported else {}),
    }


def _summary(found: Found, passed: bool, framework: str, record: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The step's one line and the data the manifest keeps."""
    results = found.results
    worst = max((c["max_abs_diff"] or 0.0 for r in results for c in r["outputs"].values()), default=0.0)
    summary = f"{'passed' if passed else 'FAILED'} at {len(results)} shapes, max abs diff {worst:.2e}"
    data: dict[str, object] = {"passed": passed, "max_abs_diff": worst, "shapes": len(results)}
    if found.web_note:
        web_worst = max((r["web"]["max_abs_diff_vs_cpu"] or 0.0 for r in results if "web" in r), default=None)
        summary += f"; {found.web_note}" + (
            f", max abs diff vs CPU provider {web_worst:.2e}" if web_worst is not None else ""
        )
        data["web"] = found.web_note
    if found.openvino is not None:
        ov = found.openvino
        summary += f"; openvino: {ov['note']}"
        data["openvino"] = {"passed": ov["passed"], "precision": ov["precision"], "max_abs_diff": ov["max_abs_diff"]}
    if found.accuracy is not None:
        acc = found.accuracy
        summary += f", accuracy {acc['onnxruntime']:.4f} ({framework} {acc['pytorch']:.4f})"
        data["accuracy"] = {"pytorch": acc["pytorch"], "onnxruntime": acc["onnxruntime"]}
    if found.embeddings is not None:
        summary += f", embedding cosine min {found.embeddings['min']:.6f}"
        data["embedding_cosine_min"] = found.embeddings["min"]
    if found.text is not None:
        text = found.text
        summary += f"; on text: {text_summary(text)}"
        data["text"] = {
            k: text[k] for k in ("perplexity", "perplexity_reference", "ppl_increase", "kld_mean", "top1_agreement")
        }
    if found.weights is not None and found.weights["worst"] is not None:
        w = found.weights["worst"]
        summary += f"; weights check: {found.weights['checked']} tensors, worst relative error {w['rel_error']:.3f}"
        data["weights_checked"] = found.weights["checked"]
    if found.graph is not None:
        summary += f"; graph check: {found.graph['note']}"
        data["graph_check"] = {"passed": found.graph["passed"], "max_abs_diff": found.graph["max_abs_diff"]}
    if found.kernels:
        summary += f"; {found.kernels}"
        data["int8_kernels"] = found.kernels
    if found.left_out:
        summary += f"; {LEFT_OUT}"
    if record.get("weights") == "random-init":
        summary += ", weights: random-init"
    return summary, json_safe(data)


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
