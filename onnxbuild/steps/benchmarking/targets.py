"""The targets beside ONNX Runtime's own providers: encoder-decoder pairs, onnxruntime-web under
Node.js, and OpenVINO's CPU plugin.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, cast

from onnxbuild.recipe.sections import (
    BenchmarkSection,
    target_variants,
)
from onnxbuild.report.benchmark import Kernels, Provider
from onnxbuild.steps.base import StepContext, StepSpec
from onnxbuild.steps.benchmarking.decode import decode_row, ort_decode
from onnxbuild.steps.benchmarking.limits import work_note
from onnxbuild.steps.benchmarking.profiles import openvino_kernels
from onnxbuild.steps.benchmarking.pytorch import seq2seq_pytorch
from onnxbuild.steps.benchmarking.timing import (
    CACHED_TOKENS,
    STATEFUL_SPAN,
    BaselineRow,
    DecodeRow,
    Row,
    batch_of,
    generation_time,
    measure,
    rss_mb,
    summarise,
    timed_at,
    timing_row,
    with_sdpa,
)
from onnxbuild.steps.exporting import section as export_kind

if TYPE_CHECKING:
    from onnxbuild.sources.decoder import PastLayout
    from onnxbuild.steps.benchmarking.timing import Feeds


def seq2seq_benchmark(
    ctx: StepContext, spec: StepSpec, record: dict[str, object], shapes: list[dict[str, int]], threads: int
) -> tuple[list[BaselineRow], list[Provider], list[Row], list[DecodeRow]]:
    """An encoder-decoder on the CPU provider: the first token (encoder plus the decoder's
    first step, the row in ``results``), one decoder step through a cache of 16 tokens, and
    a whole greedy generation of ``decode_tokens`` tokens, each beside PyTorch's (sdpa
    attention, transformers' generate() with end-of-text ignored so both make as many)."""
    import numpy as np
    import torch

    from onnxbuild.layouts import seq2seq_decoding
    from onnxbuild.sources import seq2seq
    from onnxbuild.sources.torchmodel import load_source_model, make_inputs

    bench = cast(BenchmarkSection, spec.params["benchmark"])
    export = export_kind.required(spec.params)
    n = int(bench["decode_tokens"])
    source, _ = with_sdpa(spec.params["source"])
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as ONNX Runtime's sessions run (onnxbuild/runtimes/sessions.py)
    model = load_source_model(source, record, ctx.recipe_dir)
    layout = seq2seq.layout_of(model.config)
    names = [t["name"] for t in export["inputs"]]
    start = seq2seq.start_token(model.config)
    vocab = int(model.config.vocab_size)
    cached = CACHED_TOKENS
    feeds_by_shape = [make_inputs(export["inputs"], sizes, seed=500 + i, vocab=vocab) for i, sizes in enumerate(shapes)]

    baseline: list[BaselineRow] = []
    decode: list[DecodeRow] = []
    if bench["baseline"] == "pytorch":
        baseline, decode = seq2seq_pytorch(model, names, shapes, feeds_by_shape, bench, cached)
    del model
    gc.collect()

    results: list[Row] = []
    for variant in spec.params["variants"]:
        paths = [ctx.input(f) for f in variant["files"]]
        t0 = time.perf_counter()
        runner = seq2seq_decoding.OrtSeq2Seq.load(paths[0], paths[1], threads=threads)
        created = time.perf_counter() - t0
        for sizes, feeds in zip(shapes, feeds_by_shape, strict=True):
            mask_np = feeds.get("attention_mask")
            cross_np = runner.encode(feeds)
            batch = cross_np[0].shape[0]
            ids = np.full((batch, 1), start, dtype=np.int64)
            rng = np.random.default_rng(7)
            past_np = [
                rng.standard_normal((batch, layout.kv_heads, cached, layout.head_dim)).astype(np.float32)
                for _ in layout.past_names
            ]
            prefill = timed_at(
                bench,
                lambda f=feeds, m=mask_np, b=batch, i=ids, r=runner: r.step(i, r.encode(f), m, r.empty_past(b)),
                sizes,
            )
            one = timed_at(bench, lambda c=cross_np, m=mask_np, pk=past_np, i=ids, r=runner: r.step(i, c, m, pk), sizes)
            total = generation_time(lambda f=feeds, r=runner: r.generate(f, start, n, None))
            row = timing_row(
                variant,
                "CPUExecutionProvider",
                sizes,
                prefill,
                baseline,
                created=round(created, 4),
                peak_rss_mb=rss_mb(),
                io_binding=False,
                path=paths[-1],
            )
            results.append({**row, "file_bytes": sum(p.stat().st_size for p in paths)})
            torch_decode = next((d for d in decode if d["engine"] == "pytorch" and d["shape"] == dict(sizes)), None)
            decode.append(
                {
                    "engine": "onnxruntime",
                    "variant": variant["name"],
                    "precision": variant["precision"],
                    "provider": "CPUExecutionProvider",
                    **decode_row(
                        sizes, prefill, one, n, total, torch_decode["decode_p50_ms"] if torch_decode else None
                    ),
                }
            )
        del runner
        gc.collect()
    providers: list[Provider] = [
        {
            "name": p["name"],
            "status": "used" if p["name"] == "CPUExecutionProvider" else "skipped",
            "reason": ""
            if p["name"] == "CPUExecutionProvider"
            else "encoder-decoder models are timed on the CPU provider only (for now)",
        }
        for p in spec.params["providers"]
    ]
    if not any(p["name"] == "CPUExecutionProvider" for p in providers):
        providers.append(
            {
                "name": "CPUExecutionProvider",
                "status": "used",
                "reason": "encoder-decoder models are timed on the CPU provider",
            }
        )
    return baseline, providers, results, decode


def web_benchmark(
    ctx: StepContext,
    spec: StepSpec,
    shapes: list[dict[str, int]],
    feeds_by_shape: list[Feeds],
    baseline: list[BaselineRow],
    results: list[Row],
) -> Provider:
    """The variants meant for the web (``options.variants``, default model) in onnxruntime-web
    (wasm, one thread, under Node.js), timed inside Node; ``options.iterations`` and
    ``options.warmup`` override the benchmark's (wasm is slow on big models).

    A variant wasm cannot run (a contrib op from ORT's transformer fusions, a model over
    the wasm memory limit) gets a row with the error instead of figures.
    """
    import resource

    from onnxbuild import web

    why = web.unavailable()
    if why:
        return {"name": "web", "status": "skipped", "reason": why}
    bench = cast(BenchmarkSection, spec.params["benchmark"])
    options = next(p["options"] for p in spec.params["providers"] if p["name"] == "web")
    wanted = target_variants(spec.params["providers"])["web"]
    iterations = int(options.get("iterations", bench["iterations"]))
    warmup = int(options.get("warmup", min(bench["warmup"], 1)))
    for variant in spec.params["variants"]:
        if variant["name"] not in wanted or variant.get("prefill"):  # two files: timed on ONNX Runtime only
            continue
        path = ctx.input(variant["path"])
        for sizes, feeds in zip(shapes, feeds_by_shape):
            run = web.run(path, feeds, warmup=warmup, iterations=max(iterations, 1))
            if run.error or not run.times_ms:
                results.append(
                    {
                        "variant": variant["name"],
                        "provider": "web",
                        "shape": dict(sizes),
                        "error": run.error or "no timings",
                    }
                )
                continue
            timing = summarise(run.times_ms, batch_of(sizes), warmup)
            # Node's peak (the largest child this process has waited for), not Python's.
            node_peak = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
            results.append(
                timing_row(
                    variant,
                    "web",
                    sizes,
                    timing,
                    baseline,
                    created=0.0,
                    peak_rss_mb=node_peak,
                    io_binding=False,
                    path=path,
                )
            )
    return {
        "name": "web",
        "status": "used",
        "reason": f"onnxruntime-web {web.version()} (wasm, 1 thread) under Node.js",
    }


def openvino_benchmark(
    ctx: StepContext,
    spec: StepSpec,
    shapes: list[dict[str, int]],
    feeds_by_shape: list[Feeds],
    threads: int,
    layout: PastLayout | None,
    baseline: list[BaselineRow],
    results: list[Row],
    decode: list[DecodeRow],
    kernels: dict[str, list[Kernels]],
) -> Provider:
    """Every variant in OpenVINO's CPU plugin, with the same inputs, threads and settings as ONNX
    Runtime's rows. Only the variants its options list (``options.variants``, default model)
    are validated there: the others' rows say so, and only the validated ones are timed at
    decode too (on GPT-2 decode and generate() of the other three were 20 s of the step) and
    profiled (``kernels``: variant -> OpenVINO's time per node type at the largest shape)."""
    from onnxbuild.runtimes import openvino_target

    why = openvino_target.unavailable()
    if why:
        return {"name": "openvino", "status": "skipped", "reason": why}
    bench = cast(BenchmarkSection, spec.params["benchmark"])
    options = next(p["options"] for p in spec.params["providers"] if p["name"] == "openvino")
    used: set[str] = set()
    masked = False
    stateful: list[str] = []
    listed = target_variants(spec.params["providers"])["openvino"]
    for variant in spec.params["variants"]:
        if variant.get("prefill"):  # served by two files: timed on ONNX Runtime, which serves it so
            continue
        path = ctx.input(variant["path"])
        t0 = time.perf_counter()
        try:
            session = openvino_target.load(path, precision=options.get("precision", "auto"), threads=threads)
        except Exception as exc:
            results.append(
                {
                    "variant": variant["name"],
                    "provider": "openvino",
                    "error": f"OpenVINO cannot compile it: {str(exc)[:300]}",
                }
            )
            continue
        created = time.perf_counter() - t0
        used.add(session.precision)
        for sizes, feeds in zip(shapes, feeds_by_shape):
            try:
                timing = measure(
                    lambda s=session, f=feeds: s.infer(f),
                    batch_of(sizes),
                    bench["warmup"],
                    bench["iterations"],
                    bench["min_time_s"],
                )
            except Exception as exc:
                results.append(
                    {"variant": variant["name"], "provider": "openvino", "shape": dict(sizes), "error": str(exc)[:300]}
                )
                continue
            # the precision it multiplies in: a quantized file's own, else what OpenVINO chose
            computes = (
                variant["precision"]
                if variant["precision"] in ("int8", "int4")
                else "bf16"
                if session.precision == "bf16"
                else "fp32"
            )
            if layout is not None and variant["name"] in listed:
                step = ort_decode(session, variant, "openvino", sizes, timing, bench, decode, engine="openvino")
                step["_work_of"] = work_note(path, computes)
                decode.append(step)
            row = timing_row(
                variant,
                "openvino",
                sizes,
                timing,
                baseline,
                created=round(created, 4),
                peak_rss_mb=rss_mb(),
                io_binding=False,
                path=path,
            )
            row["inference_precision"] = session.precision
            row["_work_of"] = work_note(path, computes, feeds, "prefill" if layout is not None else "")
            results.append(row)
        masked = masked or session.masked_prefill
        if session.keeps_past and variant["name"] in listed:
            stateful.append(variant["name"])
        del session
        gc.collect()
        if variant["name"] in listed and shapes:
            kernels[variant["name"]] = openvino_kernels(
                path, options.get("precision", "auto"), threads, shapes[-1], feeds_by_shape[-1], layout
            )
    note = f"OpenVINO {openvino_target.version()} CPU plugin, inference precision {', '.join(sorted(used)) or '-'}"
    if masked:
        note += "; prefill through a one-slot masked past (it refused an empty one)"
    if stateful:
        note += (
            f"; KV cache held in the model (stateful) for {', '.join(stateful)}: decode steps are successive tokens "
            f"after the past, set back untimed every {STATEFUL_SPAN} steps"
        )
    return {"name": "openvino", "status": "used", "reason": note}
