"""Decode steps on ONNX Runtime: one token after a cached past, timed as a generate loop runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild.recipe.sections import (
    BenchmarkSection,
)
from onnxbuild.runtimes import openvino_target
from onnxbuild.runtimes.sessions import Session
from onnxbuild.sources.decoder import PAST_PREFIX
from onnxbuild.steps.base import VariantParam
from onnxbuild.steps.benchmarking.limits import WORK, shapes_of_feeds
from onnxbuild.steps.benchmarking.timing import (
    STATEFUL_SPAN,
    DecodeRow,
    Timing,
    batch_of,
    decode_feeds,
    feeds_prompt,
    generation_time,
    measure,
)

if TYPE_CHECKING:
    from onnxbuild.layouts.decoding import OrtDecoder
    from onnxbuild.steps.benchmarking.timing import Feeds


def decode_row(
    sizes: dict[str, int], prefill: Timing, step: Timing, n: int, total: float, base_ms: float | None
) -> DecodeRow:
    """The decode figures both engines report; ratios against PyTorch's per-token p50 ``base_ms``."""
    return {
        "shape": dict(sizes),
        "new_tokens": n,
        "prefill_p50_ms": prefill["p50_ms"],
        "decode_p50_ms": step["p50_ms"],
        "decode_p90_ms": step["p90_ms"],
        "generate_s": round(total, 4),
        "tokens_per_s": round(n * batch_of(sizes) / total, 2),
        "decode_ratio_to_pytorch": round(step["p50_ms"] / base_ms, 3) if base_ms else None,
        "decode_speedup_vs_pytorch": round(base_ms / step["p50_ms"], 3) if base_ms and step["p50_ms"] else None,
    }


def ort_decode(
    session: Session,
    variant: VariantParam,
    provider: str,
    sizes: dict[str, int],
    prefill: Timing,
    bench: BenchmarkSection,
    decode: list[DecodeRow],
    engine: str = "onnxruntime",
    prompt_session: Session | None = None,
) -> DecodeRow:
    """The same figures for one variant: its prefill (measured above), one decode step, a whole
    generation (its prompt on ``prompt_session`` where it is served by two files)."""
    decoder, feeds, vocab = decode_step(session, sizes, prompt_session)
    n = int(bench["decode_tokens"])
    held: DecodeRow = {}
    if isinstance(session, openvino_target.Session):  # engine "openvino"
        # outputs left in place, as its prefill rows; a stateful model's steps are successive
        # tokens after the past, set back (untimed) every few steps so the past stays near its length
        prepare, step = session.decode_steps(feeds, STATEFUL_SPAN)
        timing = measure(
            step, batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"], before=prepare
        )
        if session.keeps_past:  # the pasts its steps read, from the prompt's length on
            held["decode_past"] = [sizes["sequence"], sizes["sequence"] + STATEFUL_SPAN - 1]
    else:
        timing = measure(
            lambda: session.run(None, feeds), batch_of(sizes), bench["warmup"], bench["iterations"], bench["min_time_s"]
        )
    prompt = feeds_prompt(sizes, vocab)
    total = generation_time(lambda: decoder.generate(prompt, n))
    base, bf16 = (
        {d.get("dtype", "fp32"): d for d in decode if d["engine"] == "pytorch" and d["shape"] == dict(sizes)}.get(t)
        for t in ("fp32", "bf16")
    )
    row = decode_row(sizes, prefill, timing, n, total, base["decode_p50_ms"] if base else None)
    row["decode_ratio_to_pytorch_bf16"] = round(timing["p50_ms"] / bf16["decode_p50_ms"], 3) if bf16 else None
    return {
        "engine": engine,
        "variant": variant["name"],
        "precision": variant["precision"],
        "provider": provider,
        **row,
        **held,
        WORK: shapes_of_feeds(feeds),
    }


def decode_step(
    session: Session, sizes: dict[str, int], prefill: Session | None = None
) -> tuple[OrtDecoder, Feeds, int]:
    """The feeds of one decode step after a past as long as the prompt of ``sizes`` (the decoder
    loop over ``session``, the feeds, the vocabulary size)."""
    from onnxbuild.layouts.decoding import OrtDecoder

    decoder = OrtDecoder(session, prefill=prefill)
    names = [i.name for i in session.get_inputs()]
    vocab = next(
        (int(o.shape[-1]) for o in session.get_outputs() if o.name == "logits" and isinstance(o.shape[-1], int)), 2
    )
    feeds = decode_feeds(names, decoder.layout, sizes, vocab)
    return decoder, {k: v.astype(decoder.float) if k.startswith(PAST_PREFIX) else v for k, v in feeds.items()}, vocab
