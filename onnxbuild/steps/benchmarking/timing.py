"""Inputs and timing shared by every part of the benchmark: the feeds per shape, one timed
loop (``measure``) and its summary, the rows, and the process's memory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypedDict

from onnxbuild.recipe.sections import BenchmarkSection, Tensor
from onnxbuild.report.benchmark import Machine
from onnxbuild.sources import source_kind
from onnxbuild.sources.decoder import PAST_PREFIX, PastLayout
from onnxbuild.steps.base import StepContext, StepSpec, VariantParam
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.roofline import Phase, RooflineDict

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime
    from numpy.typing import NDArray

Feeds: TypeAlias = "dict[str, NDArray[np.generic]]"
"""A session's inputs by name: token ids and masks (int64), pasts and features (float16/32)."""

STATEFUL_SPAN = 8
"""A stateful OpenVINO decoder's timed decode steps run a past up to this many tokens - 1
longer than the other rows' (GPT-2 after 128 tokens: 128-135)."""


CACHED_TOKENS = 16
"""An encoder-decoder's decode step is timed with this many decoder tokens already cached."""


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


class WorkNote(TypedDict, total=False):
    """A row's note for the roofline pass (``limits._work_note``): its graph, precision, phase and
    the call's input shapes."""

    path: str
    precision: str
    phase: Phase
    shapes: dict[str, list[int]]


class RowWork(TypedDict):
    flops: int
    weight_bytes: int
    uncounted: list[str]


class RowRoofline(RooflineDict, total=False):
    precision: str
    phase: str
    over_limit: bool


class Measured(TypedDict, total=False):
    """What the roofline pass (steps/benchmarking/limits.py) reads and writes of any row: its
    shape and times, the private notes it pops, and the work and roofline it adds."""

    shape: dict[str, int]
    p50_ms: float
    decode_p50_ms: float
    _work: dict[str, list[int]]
    _work_of: WorkNote
    work: RowWork
    roofline: RowRoofline


class Timed(Measured, total=False):
    """A row's Timing keys (p50_ms is Measured's)."""

    warmup: int
    iterations: int
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    throughput: float


class Row(Timed, total=False):
    """One entry of benchmark.json's ``results``: a variant timed on a provider at a shape (its
    Timing's keys), or the error that stopped it."""

    variant: str
    precision: str
    provider: str
    session_create_s: float
    peak_rss_mb: float
    io_binding: bool
    file_bytes: int
    speedup_vs_pytorch: float | None
    ratio_to_pytorch: float | None
    ratio_to_pytorch_bf16: float | None
    inference_precision: str
    error: str


class BaselineRow(Timed, total=False):
    """One entry of ``baseline``: PyTorch eager at a shape (its Timing's keys)."""

    engine: str
    mode: str
    dtype: str
    attention: str | None
    device: str
    peak_rss_mb: float


class DecodeRow(Measured, total=False):
    """One entry of ``decode``: an engine's prefill, decode step and whole generation at a shape
    (PyTorch's name no variant or provider)."""

    engine: str
    variant: str | None
    precision: str
    provider: str | None
    dtype: str
    new_tokens: int
    prefill_p50_ms: float
    decode_p90_ms: float
    generate_s: float
    tokens_per_s: float
    decode_ratio_to_pytorch: float | None
    decode_speedup_vs_pytorch: float | None
    decode_ratio_to_pytorch_bf16: float | None
    decode_past: list[int]


def measure(
    fn: Callable[..., object],
    batch: int,
    warmup: int,
    iterations: int,
    min_time_s: float,
    before: Callable[[], None] | None = None,
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


def machine(threads: int) -> Machine:
    import platform

    from onnxbuild.environment import cpu_info

    return {"cpu": cpu_info()[0], "cores": os.cpu_count(), "threads": threads, "system": platform.system()}


def timed_at(bench: BenchmarkSection, fn: Callable[..., object], sizes: dict[str, int]) -> Timing:
    """``measure`` with the benchmark's settings, at one shape."""
    return measure(fn, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])


def timing_row(
    variant: VariantParam,
    provider: str,
    sizes: dict[str, int],
    timing: Timing,
    baseline: list[BaselineRow],
    *,
    created: float,
    peak_rss_mb: float,
    io_binding: bool,
    path: Path,
) -> Row:
    """One timed (variant, provider, shape), beside PyTorch's times (fp32 and bf16) at the same shape."""
    base = _baseline_at(baseline, sizes, "fp32")
    bf16 = _baseline_at(baseline, sizes, "bf16")
    return {
        "variant": variant["name"],
        "precision": variant["precision"],
        "provider": provider,
        "shape": dict(sizes),
        "warmup": timing["warmup"],
        "iterations": timing["iterations"],
        "p50_ms": timing["p50_ms"],
        "p90_ms": timing["p90_ms"],
        "p99_ms": timing["p99_ms"],
        "mean_ms": timing["mean_ms"],
        "std_ms": timing["std_ms"],
        "throughput": timing["throughput"],
        "session_create_s": created,
        "peak_rss_mb": peak_rss_mb,
        "io_binding": io_binding,
        "file_bytes": path.stat().st_size,
        "speedup_vs_pytorch": round(base["p50_ms"] / timing["p50_ms"], 3) if base and timing["p50_ms"] else None,
        "ratio_to_pytorch": round(timing["p50_ms"] / base["p50_ms"], 3) if base and base["p50_ms"] else None,
        "ratio_to_pytorch_bf16": round(timing["p50_ms"] / bf16["p50_ms"], 3) if bf16 and bf16["p50_ms"] else None,
    }


def _baseline_at(baseline: list[BaselineRow], sizes: dict[str, int], dtype: str) -> BaselineRow | None:
    return next((b for b in baseline if b["shape"] == dict(sizes) and b.get("dtype", "fp32") == dtype), None)


def batch_of(sizes: dict[str, int]) -> int:
    return int(sizes.get("batch", 1))


def past_layout(ctx: StepContext) -> PastLayout:
    """The decoder's KV-cache layout, from the config.json the export step wrote beside the model."""
    import transformers

    from onnxbuild.sources.decoder import layout_of

    config = json.loads(ctx.input("config.json").read_text(encoding="utf-8"))
    return layout_of(transformers.AutoConfig.for_model(**config))


def shape_feeds(
    spec: StepSpec, ctx: StepContext, sizes: dict[str, int], index: int, layout: PastLayout | None = None
) -> Feeds:
    """Inputs for one benchmark shape; for a with-past decoder, a prefill (empty past)."""
    from onnxbuild.sources.torchmodel import make_inputs

    export = export_kind.of(spec.params)
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
    source = spec.params["source"]
    if not source:
        return None
    ((_, src),) = source.items()
    size = (src.get("config") or {}).get("vocab_size")  # a transformers config's, where the recipe gives one
    return int(size) if size else None


def with_sdpa(source: Mapping[str, dict[str, object]]) -> tuple[dict[str, dict[str, object]], str | None]:
    """A copy of the source section that loads the model with PyTorch's fused attention where
    its kind can choose (a baseline is not timed slower than the export may run), and which."""
    ((kind, src),) = source.items()
    sdpa = source_kind(kind).sdpa
    return ({kind: sdpa(src.copy())}, "sdpa") if sdpa is not None else ({kind: src.copy()}, None)


def bound_runner(session: onnxruntime.InferenceSession, feeds: Feeds, outputs: list[str]) -> Callable[[], None]:
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


def decode_feeds(names: list[str], layout: PastLayout, sizes: dict[str, int], vocab: int | None) -> Feeds:
    """One decode step: a new token per sequence after a past as long as the shape's sequence."""
    from onnxbuild.sources.torchmodel import make_inputs

    specs: list[Tensor] = [
        {"name": n, "dtype": "int64", "shape": ["batch", "total_sequence" if n == "attention_mask" else "sequence"]}
        for n in names
        if not n.startswith(PAST_PREFIX)
    ]
    return make_inputs(
        specs + layout.past_specs(),
        {"batch": batch_of(sizes), "sequence": 1, "past_sequence": sizes["sequence"]},
        seed=900,
        vocab=vocab,
    )


def generation_time(generate: Callable[..., object], repeats: int = 3) -> float:
    """Median wall time of a whole generation (prefill + decode steps)."""
    import statistics

    generate()  # warm-up: first-call allocations are not what a user waits for per request
    return statistics.median(_timed(generate) for _ in range(repeats))


def _timed(fn: Callable[..., object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def feeds_prompt(sizes: dict[str, int], vocab: int) -> NDArray[np.int64]:
    import numpy as np

    return np.random.default_rng(901).integers(0, vocab, size=(batch_of(sizes), sizes["sequence"]), dtype=np.int64)
