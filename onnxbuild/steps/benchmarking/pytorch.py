"""The PyTorch baselines, timed in the same process on the same inputs and threads: prefill in
fp32 and in bf16, decode through ``generate()``, and encoder-decoders.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, cast

from onnxbuild.environment import BF16_FLAGS, missing_feature
from onnxbuild.recipe.sections import (
    BenchmarkSection,
)
from onnxbuild.steps.base import StepContext, StepSpec
from onnxbuild.steps.benchmarking.decode import decode_row
from onnxbuild.steps.benchmarking.limits import WORK, shapes_of_feeds, work_note
from onnxbuild.steps.benchmarking.timing import (
    BaselineRow,
    DecodeRow,
    Timing,
    WorkNote,
    batch_of,
    decode_feeds,
    feeds_prompt,
    generation_time,
    measure,
    rss_mb,
    timed_at,
    with_sdpa,
)
from onnxbuild.steps.exporting import section as export_kind

if TYPE_CHECKING:
    import torch

    from onnxbuild.sources.decoder import PastLayout
    from onnxbuild.steps.benchmarking.timing import Feeds
    from onnxbuild.steps.roofline import Phase


def seq2seq_pytorch(
    model: torch.nn.Module,
    names: list[str],
    shapes: list[dict[str, int]],
    feeds_by_shape: list[Feeds],
    bench: BenchmarkSection,
    cached: int,
) -> tuple[list[BaselineRow], list[DecodeRow]]:
    """PyTorch's first token, one decoder step and whole generation (see _seq2seq_benchmark)."""
    import torch

    from onnxbuild.layouts import seq2seq_decoding
    from onnxbuild.sources import seq2seq

    layout = seq2seq.layout_of(model.config)
    masked = "attention_mask" in names
    encoder, decoder = seq2seq.encoder_module(model, names, layout), seq2seq.decoder_module(model, layout, masked)
    start = seq2seq.start_token(model.config)
    n = int(bench["decode_tokens"])

    baseline: list[BaselineRow] = []
    decode: list[DecodeRow] = []
    for sizes, feeds in zip(shapes, feeds_by_shape, strict=True):
        args = tuple(torch.from_numpy(feeds[k]) for k in names)
        mask = (torch.from_numpy(feeds["attention_mask"]),) if masked else ()
        batch = args[0].shape[0]
        first_ids = torch.full((batch, 1), start, dtype=torch.long)
        with torch.inference_mode():
            cross = encoder(*args)[1:]
            empty = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
            past = [torch.randn((batch, layout.kv_heads, cached, layout.head_dim)) for _ in layout.past_names]

            def first(
                a: tuple[torch.Tensor, ...] = args,
                m: tuple[torch.Tensor, ...] = mask,
                e: list[torch.Tensor] = empty,
                ids: torch.Tensor = first_ids,
            ) -> None:
                decoder(ids, *m, *e, *encoder(*a)[1:])

            def step(
                c: tuple[torch.Tensor, ...] = cross,
                m: tuple[torch.Tensor, ...] = mask,
                pk: list[torch.Tensor] = past,
                ids: torch.Tensor = first_ids,
            ) -> None:
                decoder(ids, *m, *pk, *c)

            prefill, one = timed_at(bench, first, sizes), timed_at(bench, step, sizes)
        total = generation_time(lambda f=feeds: seq2seq_decoding.hf_generate(model, f, n, stop_at_eos=False))
        baseline.append(
            {
                "engine": "pytorch",
                "mode": "eager",
                "attention": "sdpa",
                "device": "cpu",
                "shape": dict(sizes),
                "warmup": prefill["warmup"],
                "iterations": prefill["iterations"],
                "p50_ms": prefill["p50_ms"],
                "p90_ms": prefill["p90_ms"],
                "p99_ms": prefill["p99_ms"],
                "mean_ms": prefill["mean_ms"],
                "std_ms": prefill["std_ms"],
                "throughput": prefill["throughput"],
                "peak_rss_mb": rss_mb(),
            }
        )
        decode.append(
            {
                "engine": "pytorch",
                "variant": None,
                "provider": None,
                **decode_row(sizes, prefill, one, n, total, one["p50_ms"]),
            }
        )
    return baseline, decode


def pytorch_baseline(
    ctx: StepContext,
    spec: StepSpec,
    record: dict[str, object],
    shapes: list[dict[str, int]],
    feeds_by_shape: list[Feeds],
    threads: int,
    layout: PastLayout | None,
) -> tuple[list[BaselineRow], list[DecodeRow], dict[str, str]]:
    """PyTorch eager in fp32 and, where the CPU has native bf16, with bf16 weights; prefill and decode."""
    import torch

    from onnxbuild.sources.torchmodel import load_source_model, wrap

    source, attention = with_sdpa(spec.params["source"])
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as ONNX Runtime's sessions run (onnxbuild/runtimes/sessions.py)
    model = load_source_model(source, record, ctx.recipe_dir)
    export = export_kind.required(spec.params)
    names = [t["name"] for t in export["inputs"]] + (layout.past_names if layout is not None else [])
    wrapped = wrap(model, source, names, export["outputs"] + (layout.present_names if layout is not None else []))
    out: list[BaselineRow] = []
    decode: list[DecodeRow] = []
    bench = cast(BenchmarkSection, spec.params["benchmark"])
    for sizes, feeds in zip(shapes, feeds_by_shape):
        args = tuple(torch.from_numpy(feeds[n]) for n in names)

        def call(a: tuple[torch.Tensor, ...] = args, m: torch.nn.Module = wrapped) -> None:
            with torch.inference_mode():
                m(*a)

        timing = measure(call, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
        graph = ctx.input(spec.params["variants"][0]["path"])  # the exported model: the same products as PyTorch's
        phase: Phase = "prefill" if layout is not None else ""
        out.append(_baseline_row("fp32", attention, sizes, timing, work_note(graph, "fp32", feeds, phase)))
        if layout is not None:
            step = _pytorch_decode(model, wrapped, names, layout, sizes, timing, bench)
            step["_work_of"] = work_note(graph, "fp32")
            decode.append(step)
    # The strongest local baseline: the same module with bf16 weights, where the CPU computes
    # bf16 natively (elsewhere PyTorch emulates it, slower than fp32: no baseline a user would pick).
    why = missing_feature(BF16_FLAGS, "bf16 arithmetic")
    if why is None:
        model.to(torch.bfloat16)
        for sizes, feeds in zip(shapes, feeds_by_shape):
            args = tuple(_bf16(torch.from_numpy(feeds[n])) for n in names)

            def call16(a: tuple[torch.Tensor, ...] = args, m: torch.nn.Module = wrapped) -> None:
                with torch.inference_mode():
                    m(*a)

            timing = measure(call16, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
            out.append(_baseline_row("bf16", attention, sizes, timing, work_note(graph, "bf16", feeds, phase)))
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
                row["_work_of"] = work_note(graph, "bf16")
                decode.append(row)
    del model, wrapped
    gc.collect()
    bf16 = {
        "status": "used" if why is None else "skipped",
        "reason": "the model's weights and activations in bf16 (model.to(torch.bfloat16))"
        if why is None
        else f"{why}; PyTorch would emulate bf16, slower than its fp32",
    }
    return out, decode, bf16


def _baseline_row(
    dtype: str, attention: str | None, sizes: dict[str, int], timing: Timing, work: WorkNote
) -> BaselineRow:
    """One ``baseline`` row: PyTorch eager on the CPU at ``sizes``, with the roofline pass's note."""
    return {
        "engine": "pytorch",
        "mode": "eager",
        "dtype": dtype,
        "attention": attention,
        "device": "cpu",
        "shape": dict(sizes),
        "warmup": timing["warmup"],
        "iterations": timing["iterations"],
        "p50_ms": timing["p50_ms"],
        "p90_ms": timing["p90_ms"],
        "p99_ms": timing["p99_ms"],
        "mean_ms": timing["mean_ms"],
        "std_ms": timing["std_ms"],
        "throughput": timing["throughput"],
        "peak_rss_mb": rss_mb(),
        "_work_of": work,
    }


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """A float input in bf16 (token ids and masks stay integers)."""
    import torch

    return t.to(torch.bfloat16) if t.is_floating_point() else t


def _pytorch_decode(
    model: torch.nn.Module,
    wrapped: torch.nn.Module,
    names: list[str],
    layout: PastLayout,
    sizes: dict[str, int],
    prefill: Timing,
    bench: BenchmarkSection,
    dtype: str = "fp32",
) -> DecodeRow:
    """PyTorch's prefill and per-token decode, and transformers' generate() end to end."""
    import torch

    from onnxbuild.layouts.decoding import hf_generate

    feeds = decode_feeds(names, layout, sizes, getattr(model.config, "vocab_size", None))
    args = tuple((_bf16 if dtype == "bf16" else (lambda t: t))(torch.from_numpy(feeds[n])) for n in names)

    def step() -> None:
        with torch.inference_mode():
            wrapped(*args)

    timing = measure(step, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"])
    n = int(bench["decode_tokens"])
    prompt = feeds_prompt(sizes, getattr(model.config, "vocab_size", 2))
    total = generation_time(lambda: hf_generate(model, prompt, n))
    row = decode_row(sizes, prefill, timing, n, total, timing["p50_ms"])
    return {"engine": "pytorch", "variant": None, "provider": None, "dtype": dtype, **row, WORK: shapes_of_feeds(feeds)}
