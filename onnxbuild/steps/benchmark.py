"""The ``benchmark`` step: latency of every variant on every target provider, beside PyTorch.

The PyTorch baseline is measured in the same process and run, on the same inputs, with
the same thread count, using transformers' default attention (sdpa) rather than the
eager attention the export may use, so a speedup is not bought with a slowed baseline.
Providers that ONNX Runtime lists but cannot use (onnxruntime-gpu lists CUDA on machines
without a GPU, then silently falls back to CPU) are detected from the session's actual
providers and reported as skipped with the reason.

The kind (its plan, run and report) is here; its parts are in steps/benchmarking/:
``timing`` (the feeds per shape and the timed loop they all share), ``pytorch`` (the
baselines), ``decode`` (decode steps), ``targets`` (encoder-decoders, onnxruntime-web,
OpenVINO), ``profiles`` (where the time goes) and ``limits`` (the roofline). The Markdown
and the chart are in report/benchmark.py. What remains here (~490 lines) is the kind's plan,
its run over variants, providers and shapes, and the report with its load verdict: one flow.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from onnxbuild import environment
from onnxbuild._util import format_ms, pick, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.checks import refuse_three_files, shape_problems
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.resolve import symbolic_dims
from onnxbuild.recipe.sections import (
    BenchmarkSection,
    target_variants,
)
from onnxbuild.recipe.variants import SOURCE_RECORD
from onnxbuild.report.benchmark import Kernels, Provider, chart, markdown, validated_on
from onnxbuild.runtimes import sessions
from onnxbuild.sources import source_kind
from onnxbuild.spec import Branch, Checking, Found, Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, read_source_record
from onnxbuild.steps.benchmarking.decode import ort_decode
from onnxbuild.steps.benchmarking.limits import attach_roofline, work_note
from onnxbuild.steps.benchmarking.profiles import ort_kernels
from onnxbuild.steps.benchmarking.pytorch import pytorch_baseline
from onnxbuild.steps.benchmarking.targets import openvino_benchmark, seq2seq_benchmark, web_benchmark
from onnxbuild.steps.benchmarking.timing import (
    CACHED_TOKENS,
    BaselineRow,
    DecodeRow,
    Row,
    batch_of,
    bound_runner,
    machine,
    measure,
    past_layout,
    rss_mb,
    shape_feeds,
    timing_row,
)
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.machine import PEAKS_INPUT
from onnxbuild.steps.validating import rules

PACKAGES = ("onnxruntime", "torch", "transformers", "numpy", "openvino")


SCHEMA_VERSION = 1


EXCLUSIVE = True
"""The runner starts nothing else while a benchmark runs, and starts it only when idle."""


MEMORY = (5, 600)


def plan(p: Planning) -> list[StepSpec]:
    """Every variant timed on every provider, beside PyTorch."""
    r = p.recipe.resolved
    bench = r.get("benchmark")
    if not bench:
        return []
    inputs = [StepInput(v.step, f) for v in p.variants for f in v.paths]
    inputs.append(PEAKS_INPUT)  # the machine's limits: each row's share of them
    if p.recipe.torch_source:
        inputs.insert(0, StepInput("source", SOURCE_RECORD))
    traced = export_kind.section(r)
    with_past = bool(traced and traced["with_past"])
    if with_past:
        inputs.append(export_kind.CONFIG_INPUT)
    validated = rules.section(r)
    if p.recipe.torch_source and validated and validated["text"]:
        # quality on text beside speed in the lead: each variant's validation report
        inputs += [StepInput(v.validate_step, f"reports/validation/{v.name}.json") for v in p.variants]
    # PyTorch is timed beside a traced source only; decode steps with a past or a decoder file
    decodes = with_past or bool(p.variants and p.variants[0].files)
    unread = {*(() if p.recipe.torch_source else ("baseline",)), *(() if decodes else ("decode_tokens",))}
    return [
        StepSpec(
            name="benchmark",
            kind="benchmark",
            params={
                "benchmark": pick(bench, set(bench) - unread),
                "providers": r["providers"],
                "source": r["source"] if p.recipe.torch_source else None,
                **export_kind.signature(r),
                "variants": [v.as_param() for v in p.variants],
            },
            deps=tuple(dict.fromkeys(i.step for i in inputs)),
            inputs=tuple(inputs),
            outputs=("benchmark.json", "benchmark.md", "benchmark.png"),
            # latencies belong to the machine that measured them: a runner of another
            # kind never pulls them from a shared cache as if they were its own
            identity={
                "machine": {
                    "cpu": environment.cpu_info()[0],
                    "features": environment.cpu_fingerprint(),
                    "threads": os.cpu_count(),
                }
            },
        )
    ]


def placement(recipe: Recipe) -> tuple[float, int, str]:
    """(CPUs, GPUs, why a GPU): the threads it times with, a GPU for the CUDA provider."""
    r = recipe.resolved
    bench = r.get("benchmark")
    cpus = float((bench["threads"] if bench else 0) or 2)
    if any(q["name"] == "CUDAExecutionProvider" for q in r["providers"]):
        return cpus, 1, "benchmark on CUDAExecutionProvider"
    return cpus, 0, ""


def measured(params: Mapping[str, object]) -> str:
    """Why this kind's outputs differ from run to run (see onnxbuild.steps.describe)."""
    return "timings differ run to run"


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnxruntime as ort

    from onnxbuild.steps.peaks import cpu_share

    bench = cast(BenchmarkSection, spec.params["benchmark"])
    export = export_kind.of(spec.params)
    threads = bench["threads"] or (os.cpu_count() or 1)
    load_before = cpu_share(threads)  # a busy machine makes every time below slow: see _finish
    torch_source = export is not None
    record: dict[str, object] = {}
    if torch_source:
        record = read_source_record(ctx)
    shapes = bench["shapes"]
    if any(v.get("files") for v in spec.params["variants"]):
        return _finish(
            ctx,
            record,
            bench,
            threads,
            *seq2seq_benchmark(ctx, spec, record, shapes, threads),
            extra={
                "encoder_decoder": {"cached_tokens": CACHED_TOKENS},
                "validated": {v["name"]: ["CPUExecutionProvider"] for v in spec.params["variants"]},
            },
            load_before=load_before,
        )
    layout = past_layout(ctx) if export is not None and export.get("with_past") else None
    feeds_by_shape = [shape_feeds(spec, ctx, sizes, i, layout) for i, sizes in enumerate(shapes)]

    baseline: list[BaselineRow] = []
    decode: list[DecodeRow] = []
    bf16: dict[str, str] | None = None
    if torch_source and bench["baseline"] == "pytorch":
        baseline, decode, bf16 = pytorch_baseline(ctx, spec, record, shapes, feeds_by_shape, threads, layout)

    providers_report: list[Provider] = []
    results: list[Row] = []
    kernels: dict[str, Kernels] = {}
    ov_kernels: dict[str, list[Kernels]] = {}
    available = ort.get_available_providers()
    for prov in spec.params["providers"]:
        name, options = prov["name"], prov["options"]
        if name == "web":
            providers_report.append(web_benchmark(ctx, spec, shapes, feeds_by_shape, baseline, results))
            continue
        if name == "openvino":
            providers_report.append(
                openvino_benchmark(
                    ctx, spec, shapes, feeds_by_shape, threads, layout, baseline, results, decode, ov_kernels
                )
            )
            continue
        if name not in available:
            providers_report.append(
                {
                    "name": name,
                    "status": "skipped",
                    "reason": f"not in this onnxruntime build (it has: {', '.join(available)})",
                }
            )
            continue
        status: Provider = {"name": name, "status": "used", "reason": ""}
        for variant in spec.params["variants"]:
            path = ctx.input(variant["path"])
            so = sessions.options(threads)
            t0 = time.perf_counter()
            try:
                session = ort.InferenceSession(
                    str(path),
                    so,
                    providers=[(name, options)]
                    if name == "CPUExecutionProvider"
                    else [(name, options), "CPUExecutionProvider"],
                )
            except Exception as exc:
                results.append(
                    {"variant": variant["name"], "provider": name, "error": f"session failed: {str(exc)[:300]}"}
                )
                continue
            # a variant served by two files: the prompt (each timed shape) on its prefill file,
            # the decode steps after it on its decode file
            prefill = (
                ort.InferenceSession(str(ctx.input(variant["prefill"])), so, providers=session.get_providers())
                if variant.get("prefill")
                else None
            )
            runs, runs_path = (prefill, ctx.input(variant["prefill"])) if prefill is not None else (session, path)
            created = time.perf_counter() - t0
            if session.get_providers()[0] != name:
                status = {
                    "name": name,
                    "status": "skipped",
                    "reason": f"ONNX Runtime fell back to {session.get_providers()[0]} "
                    "(the provider is listed but not usable here)",
                }
                del session
                break
            wanted = [o.name for o in runs.get_outputs()]
            for sizes, feeds in zip(shapes, feeds_by_shape):
                usable = {k: v for k, v in feeds.items() if k in {i.name for i in runs.get_inputs()}}
                # On a device, the seeds' point: time it with host copies per run (plain run) and
                # with inputs and outputs bound on the device (IOBinding), and report both.
                modes = (False, True) if name == "CUDAExecutionProvider" else (False,)
                for io_binding in modes:
                    fn = (
                        bound_runner(runs, usable, wanted)
                        if io_binding
                        else (lambda s=runs, f=usable, w=wanted: s.run(w, f))
                    )
                    try:
                        timing = measure(fn, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
                    except Exception as exc:
                        results.append(
                            {
                                "variant": variant["name"],
                                "provider": name,
                                "shape": dict(sizes),
                                "io_binding": io_binding,
                                "error": str(exc)[:300],
                            }
                        )
                        continue
                    cpu = name == "CPUExecutionProvider"  # the measured peaks are the CPU's
                    if layout is not None and not io_binding:
                        step = ort_decode(session, variant, name, sizes, timing, bench, decode, prompt_session=prefill)
                        if cpu:
                            step["_work_of"] = work_note(path, variant["precision"])
                        decode.append(step)
                    row = timing_row(
                        variant,
                        name,
                        sizes,
                        timing,
                        baseline,
                        created=round(created, 4),
                        peak_rss_mb=rss_mb(),
                        io_binding=io_binding,
                        path=path,
                    )
                    if prefill is not None:  # both files are shipped and loaded
                        row["file_bytes"] += runs_path.stat().st_size
                    if cpu:
                        row["_work_of"] = work_note(
                            runs_path, variant["precision"], usable, "prefill" if layout is not None else ""
                        )
                    results.append(row)
            del session, prefill, runs
            gc.collect()
            if name == "CPUExecutionProvider" and shapes:
                kernels[variant["name"]] = ort_kernels(ctx, runs_path, shapes[-1], feeds_by_shape[-1], threads)
        providers_report.append(status)

    extra: dict[str, object] = {"pytorch_bf16": bf16} if bf16 else {}
    if kernels:
        extra["kernels"] = kernels
    if ov_kernels:
        extra["openvino_kernels"] = ov_kernels
    if torch_source:
        extra["validated"] = _validated(spec)
        quality = _quality(ctx, spec)
        if quality:
            extra["quality"] = quality
    return _finish(
        ctx,
        record,
        bench,
        threads,
        baseline,
        providers_report,
        results,
        decode if layout is not None else None,
        extra=extra,
        load_before=load_before,
    )


def _quality(ctx: StepContext, spec: StepSpec) -> dict[str, dict[str, object]]:
    """variant -> its figures on validate.text and whether its validation passed, where the
    recipe measures text (the benchmark then takes the validation reports as inputs)."""
    out: dict[str, dict[str, object]] = {}
    for v in spec.params["variants"]:
        try:
            report = json.loads(ctx.input(f"reports/validation/{v['name']}.json").read_text(encoding="utf-8"))
        except (KeyError, OSError, ValueError):
            return {}
        entry = report["variants"][v["name"]]
        if entry.get("text"):
            t = entry["text"]
            out[v["name"]] = {
                "passed": bool(entry["passed"]),
                "perplexity": t["perplexity"],
                "ppl_increase": t["ppl_increase"],
                "kld_mean": t["kld_mean"],
                "top1_agreement": t["top1_agreement"],
            }
    return out


def _validated(spec: StepSpec) -> dict[str, list[str]]:
    """variant -> the providers its validate step ran it on: the CPU provider, and the web and
    openvino targets for the variants they list (a failure there fails the build)."""
    chosen = target_variants(spec.params["providers"])
    return {
        v["name"]: ["CPUExecutionProvider", *(t for t, names in chosen.items() if v["name"] in names)]
        for v in spec.params["variants"]
    }


def _finish(
    ctx: StepContext,
    record: dict[str, object],
    bench: BenchmarkSection,
    threads: int,
    baseline: list[BaselineRow],
    providers_report: list[Provider],
    results: list[Row],
    decode: list[DecodeRow] | None,
    extra: dict[str, object] | None = None,
    *,
    load_before: float,
) -> StepResult:
    """benchmark.json (checked against its schema), the Markdown and the chart.

    ``load_before`` and a second look now (:func:`peaks.cpu_share`) bracket the timed calls:
    below ``LOADED_BELOW`` another job ran, and the report says every time is slow."""
    from onnxbuild.environment import versions
    from onnxbuild.steps.peaks import cpu_share
    from onnxbuild.steps.roofline import LOADED_BELOW

    report: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "recipe": ctx.recipe_name,
        "machine": machine(threads),
        "versions": versions(),
        "weights": record.get("weights"),
        "settings": {
            "warmup": bench["warmup"],
            "iterations": bench["iterations"],
            "min_time_s": bench["min_time_s"],
            "threads": threads,
            "session_config": sessions.config(),
        },
        "baseline": baseline,
        "providers": providers_report,
        "results": results,
    }
    if decode is not None:
        report["decode"] = decode
    report.update(extra or {})
    load_after = cpu_share(threads)
    loaded = min(load_before, load_after) < LOADED_BELOW
    report["load"] = {"cpu_share_before": load_before, "cpu_share_after": load_after, "loaded": loaded}
    peaks = attach_roofline(ctx, [*baseline, *results, *(decode or [])], threads)
    if peaks is not None:
        report["peaks"] = peaks
    _validate_schema(report)
    ctx.output("benchmark.json").write_text(pretty_json(report), encoding="utf-8")
    ctx.output("benchmark.md").write_text(markdown(report), encoding="utf-8")
    chart(report, ctx.output("benchmark.png"))
    validated = report.get("validated")
    best = min(
        (r for r in results if "p50_ms" in r and (validated is None or validated_on(report, dict(r)))),
        key=lambda r: r["p50_ms"],
        default=None,
    )
    summary = "no results"
    if best:
        summary = (
            f"best {'validated ' if validated else ''}{best['variant']} on "
            f"{best['provider'].replace('ExecutionProvider', '')}: p50 {format_ms(best['p50_ms'])}"
        )
        ratios = [
            f"{x:.2f}x PyTorch {t}"
            for x, t in ((best.get("ratio_to_pytorch"), "fp32"), (best.get("ratio_to_pytorch_bf16"), "bf16"))
            if x
        ]
        if ratios:
            summary += f" ({', '.join(ratios)})"
    warnings = (
        (
            f"the machine was busy while timing (a GEMM loop got {min(load_before, load_after):.0%} of {threads} "
            "threads' CPU time): every time in benchmark.md is slow",
        )
        if loaded
        else ()
    )
    return StepResult(summary=summary, data={"results": len(results)}, warnings=warnings)


def _validate_schema(report: dict[str, object]) -> None:
    import jsonschema

    from onnxbuild.report import benchmark_schema

    try:
        jsonschema.validate(report, benchmark_schema())
    except jsonschema.ValidationError as exc:
        raise StepError(
            f"benchmark.json does not match its schema at {'/'.join(map(str, exc.absolute_path))}: {exc.message} "
            "(a bug in the benchmark step)"
        ) from None


def resolve(doc: dict[str, Any], out: dict[str, Any]) -> None:
    """Shapes when the recipe gives none: batch 1 at sequence 128 for token models (the figure
    people quote), one image or clip at the sample's size, else the export sample."""
    section = out.get("benchmark")
    if section is None or "shapes" in section:
        return
    traced = export_kind.section(out)
    if traced is None:
        ((kind, src),) = out["source"].items()
        inputs = source_kind(kind).benchmark_inputs
        dims = symbolic_dims(inputs(src)) if inputs is not None else []
        section["shapes"] = [{d: 1 for d in dims}]
        return
    dims = symbolic_dims(list(traced["inputs"]))
    sample = traced["sample"]
    if set(dims) == {"batch", "sequence"}:
        section["shapes"] = [{"batch": 1, "sequence": 128}]
    elif any(t["name"] in ("pixel_values", "input_features") for t in traced["inputs"]):
        section["shapes"] = [{d: 1 if d == "batch" else sample[d] for d in dims}]
    else:
        section["shapes"] = [{d: sample[d] for d in dims}]


def check(c: Checking) -> Iterable[Found]:
    """Its shapes size what the inputs vary (validation's extra dimensions are no input)."""
    yield from refuse_three_files(c, "benchmark")
    if c.three_files:
        return
    if c.task == "image-to-text" and c.doc.get("benchmark") is not None:
        # its PyTorch baseline loads the model with sdpa attention, which TrOCR's decoder has
        # not, and the encoder-decoder benchmark has not been run on an image model yet
        yield (
            ("benchmark",),
            "not yet for image-to-text (its encoder-decoder benchmark has not been run on an image encoder); "
            "remove benchmark",
            True,
        )
        return
    if c.traced:
        yield from shape_problems(c, "benchmark", c.export_dims, optional_needed=False)


def _runs_openvino(params: Mapping[str, object]) -> bool:
    providers = params.get("providers")
    return isinstance(providers, list) and any(isinstance(p, dict) and p.get("name") == "openvino" for p in providers)


KIND = StepKind(
    name="benchmark",
    packages=PACKAGES,
    branches=(Branch(_runs_openvino, packages=("openvino",)),),
    plan=plan,
    run=run,
    memory=MEMORY,
    exclusive=EXCLUSIVE,
    measured=measured,
    placement=placement,
    imports=("onnxruntime",),
    loads_model=True,
    check=check,
    resolve=resolve,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
