"""The ``benchmark`` step: latency of every variant on every target provider, beside PyTorch.

The PyTorch baseline is measured in the same process and run, on the same inputs, with
the same thread count, using transformers' default attention (sdpa) rather than the
eager attention the export may use, so a speedup is not bought with a slowed baseline.
Providers that ONNX Runtime lists but cannot use (onnxruntime-gpu lists CUDA on machines
without a GPU, then silently falls back to CPU) are detected from the session's actual
providers and reported as skipped with the reason.

The Markdown and the chart are in report/benchmark.py; what stays (~430 lines) is the
timing of ONNX Runtime, PyTorch, decode steps and the web target, which share one
thread setting and one set of inputs per shape.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, cast

from onnxbuild import environment
from onnxbuild._util import format_ms, pick, pretty_json
from onnxbuild.environment import BF16_FLAGS, missing_feature
from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.sections import (
    SIGNATURE_KEYS,
    BenchmarkSection,
    ExportSection,
    target_variants,
)
from onnxbuild.recipe.variants import SOURCE_RECORD
from onnxbuild.report.benchmark import chart, markdown, row_name, shape_text, validated_on
from onnxbuild.runtimes import sessions
from onnxbuild.sources.decoder import PAST_PREFIX
from onnxbuild.spec import Planning, StepInput
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, read_source_record
from onnxbuild.steps.machine import PEAKS

VERSION = 12
STATEFUL_SPAN = 8
"""A stateful OpenVINO decoder's timed decode steps run a past up to this many tokens - 1
longer than the other rows' (GPT-2 after 128 tokens: 128-135)."""
PACKAGES = ("onnxruntime", "torch", "transformers", "numpy", "openvino")
SCHEMA_VERSION = 1
EXCLUSIVE = True


MEMORY = (5, 600)
CACHED_TOKENS = 16
"""An encoder-decoder's decode step is timed with this many decoder tokens already cached."""


def plan(p: Planning) -> list[StepSpec]:
    """Every variant timed on every provider, beside PyTorch."""
    r = p.recipe.resolved
    if not r.get("benchmark"):
        return []
    inputs = [StepInput(v.step, f) for v in p.variants for f in v.paths]
    inputs.append(StepInput("machine", PEAKS))  # the machine's limits: each row's share of them
    if p.recipe.torch_source:
        inputs.insert(0, StepInput("source", SOURCE_RECORD))
    with_past = bool(r.get("export") and r["export"]["with_past"])
    if with_past:
        inputs.append(StepInput("export", "config.json"))
    if p.recipe.torch_source and (r.get("validate") or {}).get("text"):
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
                "benchmark": pick(r["benchmark"], set(r["benchmark"]) - unread),
                "providers": r["providers"],
                "source": r["source"] if p.recipe.torch_source else None,
                "export": pick(r["export"], SIGNATURE_KEYS) if r.get("export") else None,
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
    cpus = float(r["benchmark"]["threads"] or 2)
    if any(q["name"] == "CUDAExecutionProvider" for q in r["providers"]):
        return cpus, 1, "benchmark on CUDAExecutionProvider"
    return cpus, 0, ""


def measured(params: dict[str, Any]) -> str:
    """Why this kind's outputs differ from run to run (see onnxbuild.steps.describe)."""
    return "timings differ run to run"


"""The runner starts nothing else while a benchmark runs, and starts it only when idle."""


class Timing(TypedDict):
    """Latency percentiles and throughput of one timed run."""

    warmup: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    throughput: float


def measure(
    fn: Any, batch: int, warmup: int, iterations: int, min_time_s: float, before: Callable[[], None] | None = None
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then at least ``iterations`` timed calls and
    ``min_time_s`` seconds; ``before()``, where given, runs untimed before every call."""

    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < iterations or time.perf_counter() - start < min_time_s:
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 100_000:
            break
    return summarise([t * 1000.0 for t in times], batch, warmup)


def summarise(times_ms: list[float], batch: int, warmup: int) -> Timing:
    """Percentiles, mean and throughput of timed calls (milliseconds each)."""
    import numpy as np

    ms = np.asarray(times_ms)
    mean = float(ms.mean())
    return {
        "warmup": warmup,
        "iterations": len(times_ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 4),
        "p90_ms": round(float(np.percentile(ms, 90)), 4),
        "p99_ms": round(float(np.percentile(ms, 99)), 4),
        "mean_ms": round(mean, 4),
        "std_ms": round(float(ms.std()), 4),
        "throughput": round(batch / (mean / 1000.0), 3) if mean > 0 else 0.0,
    }


def rss_mb() -> float:
    import psutil

    return round(float(psutil.Process().memory_info().rss) / (1024 * 1024), 1)


def machine(threads: int) -> dict[str, Any]:
    import platform

    from onnxbuild.environment import cpu_info

    return {"cpu": cpu_info()[0], "cores": os.cpu_count(), "threads": threads, "system": platform.system()}


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnxruntime as ort

    from onnxbuild.steps.roofline import cpu_share

    bench = cast(BenchmarkSection, spec.params["benchmark"])
    export = cast(ExportSection, spec.params["export"])
    threads = bench["threads"] or (os.cpu_count() or 1)
    load_before = cpu_share(threads)  # a busy machine makes every time below slow: see _finish
    torch_source = export is not None
    record: dict[str, Any] = {}
    if torch_source:
        record = read_source_record(ctx)
    shapes = bench["shapes"]
    if any(v.get("files") for v in spec.params["variants"]):
        return _finish(
            ctx,
            record,
            bench,
            threads,
            *_seq2seq_benchmark(ctx, spec, record, shapes, threads),
            extra={
                "encoder_decoder": {"cached_tokens": CACHED_TOKENS},
                "validated": {v["name"]: ["CPUExecutionProvider"] for v in spec.params["variants"]},
            },
            load_before=load_before,
        )
    layout = _past_layout(ctx) if export is not None and export.get("with_past") else None
    feeds_by_shape = [_feeds(spec, ctx, sizes, i, layout) for i, sizes in enumerate(shapes)]

    baseline: list[dict[str, Any]] = []
    decode: list[dict[str, Any]] = []
    bf16: dict[str, str] | None = None
    if torch_source and bench["baseline"] == "pytorch":
        baseline, decode, bf16 = _pytorch_baseline(ctx, spec, record, shapes, feeds_by_shape, threads, layout)

    providers_report: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    kernels: dict[str, Any] = {}
    ov_kernels: dict[str, Any] = {}
    available = ort.get_available_providers()
    for prov in spec.params["providers"]:
        name, options = prov["name"], prov["options"]
        if name == "web":
            providers_report.append(_web_benchmark(ctx, spec, shapes, feeds_by_shape, baseline, results))
            continue
        if name == "openvino":
            providers_report.append(
                _openvino_benchmark(
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
        status: dict[str, Any] = {"name": name, "status": "used", "reason": ""}
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
            wanted = [o.name for o in session.get_outputs()]
            for sizes, feeds in zip(shapes, feeds_by_shape):
                usable = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
                # On a device, the seeds' point: time it with host copies per run (plain run) and
                # with inputs and outputs bound on the device (IOBinding), and report both.
                modes = (False, True) if name == "CUDAExecutionProvider" else (False,)
                for io_binding in modes:
                    fn = (
                        _bound_runner(session, usable, wanted)
                        if io_binding
                        else (lambda s=session, f=usable, w=wanted: s.run(w, f))
                    )
                    try:
                        timing = measure(fn, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
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
                        decode.append(
                            _ort_decode(session, variant, name, sizes, timing, bench, decode)
                            | (_work_of(path, variant["precision"]) if cpu else {})
                        )
                    row = _row(
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
                    results.append(
                        row
                        | (
                            _work_of(path, variant["precision"], usable, "prefill" if layout is not None else "")
                            if cpu
                            else {}
                        )
                    )
            del session
            gc.collect()
            if name == "CPUExecutionProvider" and shapes:
                kernels[variant["name"]] = _kernels(ctx, path, shapes[-1], feeds_by_shape[-1], threads)
        providers_report.append(status)

    extra: dict[str, Any] = {"pytorch_bf16": bf16} if bf16 else {}
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


KERNELS_SHOWN = 6


def _quality(ctx: StepContext, spec: StepSpec) -> dict[str, Any]:
    """variant -> its figures on validate.text and whether its validation passed, where the
    recipe measures text (the benchmark then takes the validation reports as inputs)."""
    out: dict[str, Any] = {}
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


def _kernels(ctx: StepContext, path: Any, sizes: dict[str, int], feeds: dict[str, Any], threads: int) -> dict[str, Any]:
    """Where one call's time goes, as ONNX Runtime's profiler tells it: the CPU provider's time
    per op type (kernel) at the largest shape, from a separately profiled session (the timed
    rows run unprofiled). ORT names the op type and the provider that ran each node, not the
    MLAS routine inside it."""
    import onnxruntime as ort

    so = sessions.options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = str(ctx.output_dir / ".profile" / "ort")
    (ctx.output_dir / ".profile").mkdir(exist_ok=True)
    try:
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        usable = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        for _ in range(2):  # the second call is the one read: the first pays for allocations
            session.run(None, usable)
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    except Exception as exc:  # profiling is an explanation, never a failure of the benchmark
        return {"shape": dict(sizes), "error": str(exc)[:300], "ops": []}
    finally:
        import shutil

        shutil.rmtree(ctx.output_dir / ".profile", ignore_errors=True)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    last = runs[-1]
    start, end = last["ts"], last["ts"] + last["dur"]
    per_op: dict[str, float] = {}
    providers: set[str] = set()
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time") and start <= e["ts"] <= end:
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + e["dur"] / 1000.0
            providers.add(e.get("args", {}).get("provider", "?"))
    total = sum(per_op.values()) or 1.0
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:KERNELS_SHOWN]
    return {
        "shape": dict(sizes),
        "run_ms": round(last["dur"] / 1000.0, 3),
        "providers": sorted(providers),
        "ops": [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)} for op, ms in top],
    }


def _openvino_kernels(
    path: Any, precision: Any, threads: int, sizes: dict[str, int], feeds: dict[str, Any], layout: Any
) -> list[dict[str, Any]]:
    """Where one call's time goes in OpenVINO's CPU plugin, from its own per-node counters in a
    separately compiled, profiled model (the timed rows run without them): per node type and
    the implementation it picked (``brgemm_avx512_amx_i8``, ``ref_f32``: OpenVINO names the
    kernel, where ONNX Runtime names only the op), ms per call over 10 calls after 3 of warm-up
    (``Session.kernels``), at the largest shape, and for a decoder at one decode step after a
    past as long as that prompt too (a stateful model's: successive tokens after it). The node
    times add up to less than the call: the rest is spent outside OpenVINO's nodes (about 1 ms
    of GPT-2's 7 ms decode step)."""
    from onnxbuild.runtimes import openvino_target

    out: list[dict[str, Any]] = []
    call = "prefill" if layout is not None else "call"
    try:
        session = openvino_target.load(path, precision=precision, threads=threads, profile=True)
        out.append(_openvino_profile(session, call, feeds, sizes))
        if layout is not None:
            call = "decode"
            out.append(_openvino_profile(session, call, _decode_step(session, sizes)[1], sizes))
    except Exception as exc:  # profiling is an explanation, never a failure of the benchmark
        out.append({"call": call, "shape": dict(sizes), "error": str(exc)[:300], "ops": []})
    return out


def _openvino_profile(session: Any, call: str, feeds: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    """One entry of ``openvino_kernels``: the call's wall time and its top node types."""
    wall, per = session.kernels(feeds)
    total = sum(per.values()) or 1.0
    top = sorted(per.items(), key=lambda kv: -kv[1])[:KERNELS_SHOWN]
    return {
        "call": call,
        "shape": dict(sizes),
        "run_ms": round(wall, 3),
        "ops": [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)} for op, ms in top],
    }


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
    record: dict[str, Any],
    bench: BenchmarkSection,
    threads: int,
    baseline: list[dict[str, Any]],
    providers_report: list[dict[str, Any]],
    results: list[dict[str, Any]],
    decode: list[dict[str, Any]] | None,
    extra: dict[str, Any] | None = None,
    *,
    load_before: float,
) -> StepResult:
    """benchmark.json (checked against its schema), the Markdown and the chart.

    ``load_before`` and a second look now (:func:`roofline.cpu_share`) bracket the timed calls:
    below ``LOADED_BELOW`` another job ran, and the report says every time is slow."""
    from onnxbuild.environment import versions
    from onnxbuild.steps.roofline import LOADED_BELOW, cpu_share

    report: dict[str, Any] = {
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
            "session_config": dict(sessions.SESSION_CONFIG),
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
    peaks = _attach_roofline(ctx, [*baseline, *results, *(decode or [])], threads)
    if peaks is not None:
        report["peaks"] = peaks
    _validate_schema(report)
    ctx.output("benchmark.json").write_text(pretty_json(report), encoding="utf-8")
    ctx.output("benchmark.md").write_text(markdown(report), encoding="utf-8")
    chart(report, ctx.output("benchmark.png"))
    validated = report.get("validated")
    best = min(
        (r for r in results if "p50_ms" in r and (validated is None or validated_on(report, r))),
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


WORK = "_work"
"""A row's private note for the roofline pass (the graph, precision, phase and input shapes of
one call), removed before the report is written."""


def _work_of(path: Any, precision: str, feeds: dict[str, Any] | None = None, phase: str = "decode") -> dict[str, Any]:
    """What the roofline pass needs to count one row's work: its graph, precision and phase;
    ``feeds`` the call's inputs (a decode row's come from the step that timed it)."""
    note: dict[str, Any] = {"path": str(path), "precision": precision, "phase": phase}
    if feeds is not None:
        note["shapes"] = _shapes(feeds)
    return {WORK + "_of": note}


def _shapes(feeds: dict[str, Any]) -> dict[str, list[int]]:
    return {k: [int(d) for d in v.shape] for k, v in feeds.items()}


def _attach_roofline(ctx: StepContext, rows: list[dict[str, Any]], threads: int) -> dict[str, Any] | None:
    """Each row noted by ``_work_of``: the matrix-product FLOPs and weight bytes of one call,
    and its share of the machine's limit (onnxbuild/steps/roofline.py); returns the peaks used.

    PyTorch's rows count the exported graph's products (the same matrices), with weights half
    as many bytes in bf16. Rows on a GPU, in wasm or of an encoder-decoder get none.

    A row over 100% of its limit means the limit was measured low (a busy machine, a size too
    small): the peaks are measured again here, at a longer budget, each figure the higher of
    the two; a row still over it is marked ``over_limit``, and the report says the limit is
    wrong rather than print "180% of bf16 GEMM" as if it were a figure."""
    from onnxbuild.steps.roofline import Peaks, measure_peaks

    notes = [(row, row.pop(WORK + "_of", None), row.pop(WORK, None)) for row in rows]
    try:
        peaks = Peaks.from_dict(json.loads(ctx.input(PEAKS).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    works = _works(notes)
    _rooflines(works, peaks)
    over = [row for row, _ in works if row["roofline"]["fraction"] > 1.0]
    remeasured = ""
    if over:
        first = over[0]
        again = peaks.at_least(measure_peaks(threads, budget_s=REMEASURE_S))
        rose = [
            k
            for k in ("fp32_gflops", "bf16_gflops", "int8_gops", "memory_gbps")
            if getattr(again, k) != getattr(peaks, k)
        ]
        remeasured = (
            f"{row_name(first)} at {shape_text(first.get('shape') or {})} reached {first['roofline']['fraction']:.0%} "
            f"of {first['roofline']['limit']}: measured again, "
            + (f"{', '.join(rose)} rose" if rose else "no figure rose")
        )
        peaks = again
        _rooflines(works, peaks)
        for row, _ in works:
            if row["roofline"]["fraction"] > 1.0:
                row["roofline"]["over_limit"] = True
    out: dict[str, Any] = {**peaks.as_dict(), "loaded": peaks.loaded}
    if remeasured:
        out["remeasured"] = remeasured
    return out


REMEASURE_S = 0.5
"""Seconds per figure and size when a row beat the cached peaks (the machine step uses 0.15)."""


Counted = tuple[dict[str, Any], tuple[Any, str, Any, float]]
"""A timed row and what the roofline reads of it: its work, precision, phase and time (ms)."""


def _works(notes: list[tuple[dict[str, Any], Any, Any]]) -> list[Counted]:
    """(row, (its work, precision, phase, ms)) for each row whose graph the counter can size."""
    import dataclasses

    import onnx

    from onnxbuild.steps.roofline import graph_work

    loaded: tuple[str, Any] | None = None
    counted: dict[
        str, Any
    ] = {}  # graph and shapes -> its work (PyTorch's fp32 and bf16 rows, OpenVINO's rows share ONNX Runtime's)
    out: list[Counted] = []
    for row, note, decode_shapes in sorted((n for n in notes if n[1]), key=lambda n: n[1]["path"]):
        shapes = note.get("shapes") or decode_shapes
        if not shapes:
            continue
        key = json.dumps([note["path"], shapes], sort_keys=True)
        if key not in counted:
            if loaded is None or loaded[0] != note["path"]:  # one model in memory at a time
                loaded = (note["path"], onnx.load_model(note["path"]))
            try:
                counted[key] = graph_work(loaded[1], {k: tuple(v) for k, v in shapes.items()})
            except Exception:  # a graph the counter cannot size: the row keeps its times only
                counted[key] = None
        work = counted[key]
        if work is None:
            continue
        if note["precision"] == "bf16":
            work = dataclasses.replace(work, weight_bytes=work.weight_bytes // 2)
        ms = row["decode_p50_ms"] if note["phase"] == "decode" else row["p50_ms"]
        row["work"] = {"flops": work.flops, "weight_bytes": work.weight_bytes, "uncounted": list(work.uncounted)}
        out.append((row, (work, note["precision"], note["phase"], ms)))
    return out


def _rooflines(works: list[Counted], peaks: Any) -> None:
    from onnxbuild.steps.roofline import roofline

    for row, (work, precision, phase, ms) in works:
        row["roofline"] = {
            **roofline(work, ms, precision, peaks, phase).as_dict(),
            "precision": precision,
            "phase": phase,
        }


def _seq2seq_benchmark(
    ctx: StepContext, spec: StepSpec, record: dict[str, Any], shapes: list[dict[str, int]], threads: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """An encoder-decoder on the CPU provider: the first token (encoder plus the decoder's
    first step, the row in ``results``), one decoder step through a cache of 16 tokens, and
    a whole greedy generation of ``decode_tokens`` tokens, each beside PyTorch's (sdpa
    attention, transformers' generate() with end-of-text ignored so both make as many)."""
    import numpy as np
    import torch

    from onnxbuild.sources import seq2seq
    from onnxbuild.sources.torchmodel import load_source_model, make_inputs

    bench = cast(BenchmarkSection, spec.params["benchmark"])
    export = cast(ExportSection, spec.params["export"])
    n = int(bench["decode_tokens"])
    source = json.loads(json.dumps(spec.params["source"]))
    source["huggingface"]["attn_implementation"] = "sdpa"
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as ONNX Runtime's sessions run (onnxbuild/runtimes/sessions.py)
    model = load_source_model(source, record, ctx.recipe_dir)
    layout = seq2seq.layout_of(model.config)
    names = [t["name"] for t in export["inputs"]]
    start = seq2seq.start_token(model.config)
    vocab = int(model.config.vocab_size)
    cached = CACHED_TOKENS
    feeds_by_shape = [make_inputs(export["inputs"], sizes, seed=500 + i, vocab=vocab) for i, sizes in enumerate(shapes)]

    baseline: list[dict[str, Any]] = []
    decode: list[dict[str, Any]] = []
    if bench["baseline"] == "pytorch":
        baseline, decode = _seq2seq_pytorch(model, names, shapes, feeds_by_shape, bench, cached)
    del model
    gc.collect()

    results: list[dict[str, Any]] = []
    for variant in spec.params["variants"]:
        paths = [ctx.input(f) for f in variant["files"]]
        t0 = time.perf_counter()
        runner = seq2seq.OrtSeq2Seq.load(paths[0], paths[1], threads=threads)
        created = time.perf_counter() - t0
        for sizes, feeds in zip(shapes, feeds_by_shape, strict=True):
            mask_np = feeds.get("attention_mask")
            hidden_np = runner.encode(feeds)
            batch = hidden_np.shape[0]
            ids = np.full((batch, 1), start, dtype=np.int64)
            rng = np.random.default_rng(7)
            past_np = [
                rng.standard_normal((batch, layout.kv_heads, cached, layout.head_dim)).astype(np.float32)
                for _ in layout.past_names
            ]
            prefill = _timed_at(
                bench,
                lambda f=feeds, m=mask_np, b=batch, i=ids, r=runner: r.step(i, r.encode(f), m, r.empty_past(b)),
                sizes,
            )
            one = _timed_at(
                bench, lambda h=hidden_np, m=mask_np, pk=past_np, i=ids, r=runner: r.step(i, h, m, pk), sizes
            )
            total = _generation_time(lambda f=feeds, r=runner: r.generate(f, start, n, None))
            row = _row(
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
                    **_decode_row(
                        sizes, prefill, one, n, total, torch_decode["decode_p50_ms"] if torch_decode else None
                    ),
                }
            )
        del runner
        gc.collect()
    providers = [
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


def _timed_at(bench: BenchmarkSection, fn: Any, sizes: dict[str, int]) -> Timing:
    """``measure`` with the benchmark's settings, at one shape."""
    return measure(fn, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])


def _seq2seq_pytorch(
    model: Any,
    names: list[str],
    shapes: list[dict[str, int]],
    feeds_by_shape: list[dict[str, Any]],
    bench: BenchmarkSection,
    cached: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """PyTorch's first token, one decoder step and whole generation (see _seq2seq_benchmark)."""
    import torch

    from onnxbuild.sources import seq2seq

    layout = seq2seq.layout_of(model.config)
    masked = "attention_mask" in names
    encoder, decoder = seq2seq.encoder_module(model, names), seq2seq.decoder_module(model, layout, masked)
    start = seq2seq.start_token(model.config)
    n = int(bench["decode_tokens"])

    baseline: list[dict[str, Any]] = []
    decode: list[dict[str, Any]] = []
    for sizes, feeds in zip(shapes, feeds_by_shape, strict=True):
        args = tuple(torch.from_numpy(feeds[k]) for k in names)
        mask = (torch.from_numpy(feeds["attention_mask"]),) if masked else ()
        batch = args[0].shape[0]
        first_ids = torch.full((batch, 1), start, dtype=torch.long)
        with torch.inference_mode():
            (hidden,) = encoder(*args)
            empty = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
            past = [torch.randn((batch, layout.kv_heads, cached, layout.head_dim)) for _ in layout.past_names]

            def first(
                a: tuple[Any, ...] = args, m: tuple[Any, ...] = mask, e: list[Any] = empty, ids: Any = first_ids
            ) -> None:
                (h,) = encoder(*a)
                decoder(ids, h, *m, *e)

            def step(h: Any = hidden, m: tuple[Any, ...] = mask, pk: list[Any] = past, ids: Any = first_ids) -> None:
                decoder(ids, h, *m, *pk)

            prefill, one = _timed_at(bench, first, sizes), _timed_at(bench, step, sizes)
        total = _generation_time(lambda f=feeds: seq2seq.hf_generate(model, f, n, stop_at_eos=False))
        baseline.append(
            {
                "engine": "pytorch",
                "mode": "eager",
                "attention": "sdpa",
                "device": "cpu",
                "shape": dict(sizes),
                **prefill,
                "peak_rss_mb": rss_mb(),
            }
        )
        decode.append(
            {
                "engine": "pytorch",
                "variant": None,
                "provider": None,
                **_decode_row(sizes, prefill, one, n, total, one["p50_ms"]),
            }
        )
    return baseline, decode


def _web_benchmark(
    ctx: StepContext,
    spec: StepSpec,
    shapes: list[dict[str, int]],
    feeds_by_shape: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    results: list[dict[str, Any]],
) -> dict[str, Any]:
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
        if variant["name"] not in wanted:
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
            timing = summarise(run.times_ms, _batch(sizes), warmup)
            # Node's peak (the largest child this process has waited for), not Python's.
            node_peak = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
            results.append(
                _row(
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


def _openvino_benchmark(
    ctx: StepContext,
    spec: StepSpec,
    shapes: list[dict[str, int]],
    feeds_by_shape: list[dict[str, Any]],
    threads: int,
    layout: Any,
    baseline: list[dict[str, Any]],
    results: list[dict[str, Any]],
    decode: list[dict[str, Any]],
    kernels: dict[str, Any],
) -> dict[str, Any]:
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
                    _batch(sizes),
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
                decode.append(
                    _ort_decode(session, variant, "openvino", sizes, timing, bench, decode, engine="openvino")
                    | _work_of(path, computes)
                )
            row = _row(
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
            results.append(
                row
                | {"inference_precision": session.precision}
                | _work_of(path, computes, feeds, "prefill" if layout is not None else "")
            )
        masked = masked or session.masked_prefill
        if session.keeps_past and variant["name"] in listed:
            stateful.append(variant["name"])
        del session
        gc.collect()
        if variant["name"] in listed and shapes:
            kernels[variant["name"]] = _openvino_kernels(
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


def _row(
    variant: dict[str, Any],
    provider: str,
    sizes: dict[str, int],
    timing: Timing,
    baseline: list[dict[str, Any]],
    *,
    created: float,
    peak_rss_mb: float,
    io_binding: bool,
    path: Any,
) -> dict[str, Any]:
    """One timed (variant, provider, shape), beside PyTorch's times (fp32 and bf16) at the same shape."""
    base = _baseline_at(baseline, sizes, "fp32")
    bf16 = _baseline_at(baseline, sizes, "bf16")
    return {
        "variant": variant["name"],
        "precision": variant["precision"],
        "provider": provider,
        "shape": dict(sizes),
        **timing,
        "session_create_s": created,
        "peak_rss_mb": peak_rss_mb,
        "io_binding": io_binding,
        "file_bytes": path.stat().st_size,
        "speedup_vs_pytorch": round(base["p50_ms"] / timing["p50_ms"], 3) if base and timing["p50_ms"] else None,
        "ratio_to_pytorch": round(timing["p50_ms"] / base["p50_ms"], 3) if base and base["p50_ms"] else None,
        "ratio_to_pytorch_bf16": round(timing["p50_ms"] / bf16["p50_ms"], 3) if bf16 and bf16["p50_ms"] else None,
    }


def _baseline_at(baseline: list[dict[str, Any]], sizes: dict[str, int], dtype: str) -> dict[str, Any] | None:
    return next((b for b in baseline if b["shape"] == dict(sizes) and b.get("dtype", "fp32") == dtype), None)


def _batch(sizes: dict[str, int]) -> int:
    return int(sizes.get("batch", 1))


def _past_layout(ctx: StepContext) -> Any:
    """The decoder's KV-cache layout, from the config.json the export step wrote beside the model."""
    import transformers

    from onnxbuild.sources.decoder import layout_of

    config = json.loads(ctx.input("config.json").read_text(encoding="utf-8"))
    return layout_of(transformers.AutoConfig.for_model(**config))


def _feeds(spec: StepSpec, ctx: StepContext, sizes: dict[str, int], index: int, layout: Any = None) -> dict[str, Any]:
    """Inputs for one benchmark shape; for a with-past decoder, a prefill (empty past)."""
    from onnxbuild.sources.torchmodel import make_inputs

    export = cast(ExportSection, spec.params["export"])
    if export is not None:
        specs = export["inputs"] + (layout.past_specs() if layout is not None else [])
        return make_inputs(
            specs, {**sizes, "past_sequence": 0} if layout is not None else sizes, seed=500 + index, vocab=_vocab(spec)
        )
    import onnx

    model = onnx.load_model(str(ctx.input(spec.params["variants"][0]["path"])), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        specs.append({"name": v.name, "dtype": dtype, "shape": shape})
    return make_inputs(specs, sizes, seed=500 + index, vocab=None)


def _vocab(spec: StepSpec) -> int | None:
    src = spec.params["source"].get("huggingface")
    if not src:
        return None
    size = (src.get("config") or {}).get("vocab_size")
    return int(size) if size else None


def _bound_runner(session: Any, feeds: dict[str, Any], outputs: list[str]) -> Any:
    """IOBinding on CUDA: inputs copied to the device once, outputs left there (no host copies per run)."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for name in outputs:
        binding.bind_output(name, "cuda")

    def go() -> None:
        session.run_with_iobinding(binding)

    return go


def _pytorch_baseline(
    ctx: StepContext,
    spec: StepSpec,
    record: dict[str, Any],
    shapes: list[dict[str, int]],
    feeds_by_shape: list[dict[str, Any]],
    threads: int,
    layout: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str]]:
    """PyTorch eager in fp32 and, where the CPU has native bf16, with bf16 weights; prefill and decode."""
    import torch

    from onnxbuild.sources.torchmodel import load_source_model, wrap

    source = json.loads(json.dumps(spec.params["source"]))
    attention = None
    if "huggingface" in source:
        source["huggingface"]["attn_implementation"] = "sdpa"
        attention = "sdpa"
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as ONNX Runtime's sessions run (onnxbuild/runtimes/sessions.py)
    model = load_source_model(source, record, ctx.recipe_dir)
    export = cast(ExportSection, spec.params["export"])
    names = [t["name"] for t in export["inputs"]] + (layout.past_names if layout is not None else [])
    wrapped = wrap(model, source, names, export["outputs"] + (layout.present_names if layout is not None else []))
    out = []
    decode: list[dict[str, Any]] = []
    bench = cast(BenchmarkSection, spec.params["benchmark"])
    for sizes, feeds in zip(shapes, feeds_by_shape):
        args = tuple(torch.from_numpy(feeds[n]) for n in names)

        def call(a: tuple[Any, ...] = args, m: Any = wrapped) -> None:
            with torch.inference_mode():
                m(*a)

        timing = measure(call, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
        graph = ctx.input(spec.params["variants"][0]["path"])  # the exported model: the same products as PyTorch's
        phase = "prefill" if layout is not None else ""
        out.append(
            {
                "engine": "pytorch",
                "mode": "eager",
                "dtype": "fp32",
                "attention": attention,
                "device": "cpu",
                "shape": dict(sizes),
                **timing,
                "peak_rss_mb": rss_mb(),
            }
            | _work_of(graph, "fp32", feeds, phase)
        )
        if layout is not None:
            decode.append(
                _pytorch_decode(model, wrapped, names, layout, sizes, timing, bench) | _work_of(graph, "fp32")
            )
    # The strongest local baseline: the same module with bf16 weights, where the CPU computes
    # bf16 natively (elsewhere PyTorch emulates it, slower than fp32: no baseline a user would pick).
    why = missing_feature(BF16_FLAGS, "bf16 arithmetic")
    if why is None:
        model.to(torch.bfloat16)
        for sizes, feeds in zip(shapes, feeds_by_shape):
            args = tuple(_bf16(torch.from_numpy(feeds[n])) for n in names)

            def call16(a: tuple[Any, ...] = args, m: Any = wrapped) -> None:
                with torch.inference_mode():
                    m(*a)

            timing = measure(call16, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
            out.append(
                {
                    "engine": "pytorch",
                    "mode": "eager",
                    "dtype": "bf16",
                    "attention": attention,
                    "device": "cpu",
                    "shape": dict(sizes),
                    **timing,
                    "peak_rss_mb": rss_mb(),
                }
                | _work_of(graph, "bf16", feeds, phase)
            )
            if layout is not None:
                row = _pytorch_decode(model, wrapped, names, layout, sizes, timing, bench, dtype="bf16")
                fp32 = next(
                    d for d in decode if d["engine"] == "pytorch" and d["shape"] == dict(sizes) and d["dtype"] == "fp32"
                )
                row["decode_ratio_to_pytorch"] = round(
                    row["decode_p50_ms"] / fp32["decode_p50_ms"], 3
                )  # against fp32, as every row
                row["decode_speedup_vs_pytorch"] = round(fp32["decode_p50_ms"] / row["decode_p50_ms"], 3)
                fp32["decode_ratio_to_pytorch_bf16"] = round(fp32["decode_p50_ms"] / row["decode_p50_ms"], 3)
                decode.append(row | _work_of(graph, "bf16"))
    del model, wrapped
    gc.collect()
    bf16 = {
        "status": "used" if why is None else "skipped",
        "reason": "the model's weights and activations in bf16 (model.to(torch.bfloat16))"
        if why is None
        else f"{why}; PyTorch would emulate bf16, slower than its fp32",
    }
    return out, decode, bf16


def _bf16(t: Any) -> Any:
    """A float input in bf16 (token ids and masks stay integers)."""
    import torch

    return t.to(torch.bfloat16) if t.is_floating_point() else t


def _decode_feeds(names: list[str], layout: Any, sizes: dict[str, int], vocab: int | None) -> dict[str, Any]:
    """One decode step: a new token per sequence after a past as long as the shape's sequence."""
    from onnxbuild.sources.torchmodel import make_inputs

    specs = [
        {"name": n, "dtype": "int64", "shape": ["batch", "total_sequence" if n == "attention_mask" else "sequence"]}
        for n in names
        if not n.startswith(PAST_PREFIX)
    ]
    return make_inputs(
        specs + layout.past_specs(),
        {"batch": _batch(sizes), "sequence": 1, "past_sequence": sizes["sequence"]},
        seed=900,
        vocab=vocab,
    )


def _generation_time(generate: Any, repeats: int = 3) -> float:
    """Median wall time of a whole generation (prefill + decode steps)."""
    import statistics

    generate()  # warm-up: first-call allocations are not what a user waits for per request
    return statistics.median(_timed(generate) for _ in range(repeats))


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pytorch_decode(
    model: Any,
    wrapped: Any,
    names: list[str],
    layout: Any,
    sizes: dict[str, int],
    prefill: Timing,
    bench: BenchmarkSection,
    dtype: str = "fp32",
) -> dict[str, Any]:
    """PyTorch's prefill and per-token decode, and transformers' generate() end to end."""
    import torch

    from onnxbuild.sources.decoder import hf_generate

    feeds = _decode_feeds(names, layout, sizes, getattr(model.config, "vocab_size", None))
    args = tuple((_bf16 if dtype == "bf16" else (lambda t: t))(torch.from_numpy(feeds[n])) for n in names)

    def step() -> None:
        with torch.inference_mode():
            wrapped(*args)

    timing = measure(step, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
    n = int(bench["decode_tokens"])
    prompt = feeds_prompt(sizes, getattr(model.config, "vocab_size", 2))
    total = _generation_time(lambda: hf_generate(model, prompt, n))
    row = _decode_row(sizes, prefill, timing, n, total, timing["p50_ms"])
    return {"engine": "pytorch", "variant": None, "provider": None, "dtype": dtype, **row, WORK: _shapes(feeds)}


def _decode_row(
    sizes: dict[str, int], prefill: Timing, step: Timing, n: int, total: float, base_ms: float | None
) -> dict[str, Any]:
    """The decode figures both engines report; ratios against PyTorch's per-token p50 ``base_ms``."""
    return {
        "shape": dict(sizes),
        "new_tokens": n,
        "prefill_p50_ms": prefill["p50_ms"],
        "decode_p50_ms": step["p50_ms"],
        "decode_p90_ms": step["p90_ms"],
        "generate_s": round(total, 4),
        "tokens_per_s": round(n * _batch(sizes) / total, 2),
        "decode_ratio_to_pytorch": round(step["p50_ms"] / base_ms, 3) if base_ms else None,
        "decode_speedup_vs_pytorch": round(base_ms / step["p50_ms"], 3) if base_ms and step["p50_ms"] else None,
    }


def feeds_prompt(sizes: dict[str, int], vocab: int) -> Any:
    import numpy as np

    return np.random.default_rng(901).integers(0, vocab, size=(_batch(sizes), sizes["sequence"]), dtype=np.int64)


def _ort_decode(
    session: Any,
    variant: dict[str, Any],
    provider: str,
    sizes: dict[str, int],
    prefill: Timing,
    bench: BenchmarkSection,
    decode: list[dict[str, Any]],
    engine: str = "onnxruntime",
) -> dict[str, Any]:
    """The same figures for one variant: its prefill (measured above), one decode step, a whole generation."""
    decoder, feeds, vocab = _decode_step(session, sizes)
    n = int(bench["decode_tokens"])
    held: dict[str, Any] = {}
    if engine == "openvino":
        # outputs left in place, as its prefill rows; a stateful model's steps are successive
        # tokens after the past, set back (untimed) every few steps so the past stays near its length
        prepare, step = session.decode_steps(feeds, STATEFUL_SPAN)
        timing = measure(step, _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"], before=prepare)
        if session.keeps_past:  # the pasts its steps read, from the prompt's length on
            held["decode_past"] = [sizes["sequence"], sizes["sequence"] + STATEFUL_SPAN - 1]
    else:
        timing = measure(
            lambda: session.run(None, feeds), _batch(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"]
        )
    prompt = feeds_prompt(sizes, vocab)
    total = _generation_time(lambda: decoder.generate(prompt, n))
    base, bf16 = (
        {d.get("dtype", "fp32"): d for d in decode if d["engine"] == "pytorch" and d["shape"] == dict(sizes)}.get(t)
        for t in ("fp32", "bf16")
    )
    row = _decode_row(sizes, prefill, timing, n, total, base["decode_p50_ms"] if base else None)
    row["decode_ratio_to_pytorch_bf16"] = round(timing["p50_ms"] / bf16["decode_p50_ms"], 3) if bf16 else None
    return {
        "engine": engine,
        "variant": variant["name"],
        "precision": variant["precision"],
        "provider": provider,
        **row,
        **held,
        WORK: _shapes(feeds),
    }


def _decode_step(session: Any, sizes: dict[str, int]) -> tuple[Any, dict[str, Any], int]:
    """The feeds of one decode step after a past as long as the prompt of ``sizes`` (the decoder
    loop over ``session``, the feeds, the vocabulary size)."""
    from onnxbuild.sources.decoder import OrtDecoder

    decoder = OrtDecoder(session)
    names = [i.name for i in session.get_inputs()]
    vocab = next(
        (int(o.shape[-1]) for o in session.get_outputs() if o.name == "logits" and isinstance(o.shape[-1], int)), 2
    )
    feeds = _decode_feeds(names, decoder.layout, sizes, vocab)
    return decoder, {k: v.astype(decoder.float) if k.startswith(PAST_PREFIX) else v for k, v in feeds.items()}, vocab


def _validate_schema(report: dict[str, Any]) -> None:
    import jsonschema

    from onnxbuild.report import benchmark_schema

    try:
        jsonschema.validate(report, benchmark_schema())
    except jsonschema.ValidationError as exc:
        raise StepError(
            f"benchmark.json does not match its schema at {'/'.join(map(str, exc.absolute_path))}: {exc.message} "
            "(a bug in the benchmark step)"
        ) from None
