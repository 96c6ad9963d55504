"""benchmark.json as people read it: the Markdown table and the latency chart (pure
functions of the report; matplotlib is imported only to draw). One module (~510 lines): the
report's TypedDicts (mirroring benchmark.schema.json, about a fifth of it) beside every table
and sentence written from them, so a field is rendered next to its declaration."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict, cast

from onnxbuild._util import format_ms

if TYPE_CHECKING:
    from pathlib import Path


# benchmark.json's keys this module reads, as benchmark.schema.json types them (total=False:
# the schema's rows and sections vary; a key it requires is read with [] where it is present).
class Work(TypedDict):
    flops: int
    weight_bytes: int


class Row(TypedDict, total=False):
    """A results or baseline row: the timed ones, and a results row that failed (error)."""

    variant: str
    provider: str
    shape: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float
    io_binding: bool
    inference_precision: str
    ratio_to_pytorch: float | None
    ratio_to_pytorch_bf16: float | None
    error: str
    dtype: str
    mode: str
    attention: str | None
    work: Work
    roofline: dict[str, object]


class DecodeRow(TypedDict, total=False):
    engine: str
    variant: str | None
    provider: str | None
    shape: dict[str, int]
    dtype: str
    new_tokens: int
    prefill_p50_ms: float
    decode_p50_ms: float
    decode_p90_ms: float
    decode_past: list[int]
    tokens_per_s: float
    decode_ratio_to_pytorch: float | None
    decode_ratio_to_pytorch_bf16: float | None
    roofline: dict[str, object]


class Provider(TypedDict):
    name: str
    status: str
    reason: str


class KernelOp(TypedDict):
    op: str
    ms: float
    share: float


class Kernels(TypedDict, total=False):
    """Where one call's time goes (``kernels``, ``openvino_kernels``): its top ops, or why none."""

    call: str
    shape: dict[str, int]
    run_ms: float
    providers: list[str]
    error: str
    ops: list[KernelOp]


class Quality(TypedDict):
    passed: bool
    perplexity: float
    ppl_increase: float
    kld_mean: float
    top1_agreement: float


class Machine(TypedDict):
    """``machine``: where the figures were measured."""

    cpu: str
    cores: int | None
    threads: int
    system: str


class Settings(TypedDict, total=False):
    warmup: int
    iterations: int
    session_config: dict[str, str]


class Load(TypedDict):
    cpu_share_before: float
    cpu_share_after: float
    loaded: bool


class Status(TypedDict):
    status: str
    reason: str


class EncoderDecoder(TypedDict):
    cached_tokens: int


class BenchmarkReport(TypedDict, total=False):
    recipe: str
    weights: str | None
    machine: Machine
    settings: Settings
    baseline: list[Row]
    providers: list[Provider]
    results: list[Row]
    encoder_decoder: EncoderDecoder
    decode: list[DecodeRow]
    pytorch_bf16: Status
    validated: dict[str, list[str]]
    quality: dict[str, Quality]
    peaks: dict[str, object]
    kernels: dict[str, Kernels]
    openvino_kernels: dict[str, list[Kernels]]
    load: Load


def _checked(report: Mapping[str, object]) -> BenchmarkReport:
    # The benchmark step builds the report and validates it against benchmark.schema.json
    # before it calls markdown, chart or validated_on; these TypedDicts mirror that schema.
    return cast(BenchmarkReport, report)


def markdown(report_: Mapping[str, object]) -> str:
    report = _checked(report_)
    m = report["machine"]
    lines = [
        f"# {report['recipe']}: benchmark",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads; warmup {report['settings']['warmup']}, "
        f"at least {report['settings']['iterations']} iterations. PyTorch baseline measured in the same run.",
        "",
    ]
    config = report["settings"].get("session_config") or {}
    if config.get("session.set_denormal_as_zero") == "1":
        lines += [
            "Denormals flushed to zero on both sides: ONNX Runtime sessions with `session.set_denormal_as_zero=1` "
            "(its CPU attention kernels slow down on the denormals a causal prefill produces), PyTorch with "
            "`torch.set_flush_denormal(True)`. To get these figures, set the same on your ONNX Runtime "
            "sessions. Both set the flags on the calling thread and leave them set: OpenVINO rows run with "
            "them cleared for each call and restored after it (onnxbuild/runtimes/fpenv.py), since OpenVINO "
            "2026.4's CPU plugin fails on AVX2-only CPUs under them; do the same where one thread runs "
            "ONNX Runtime or PyTorch and then OpenVINO.",
            "",
        ]
    if any(r.get("provider") == "openvino" and "p50_ms" in r for r in report["results"]):
        lines += [
            "OpenVINO rows time the inference request with its outputs read in place (`share_outputs`), "
            "as ONNX Runtime's `run()` hands over its own output buffers: a copy of every output on top "
            "is what a caller that keeps them pays (GPT-2, 128 tokens: 35 MB).",
            "",
        ]
        ov = next(
            (p for p in report["providers"] if p["name"] == "openvino" and p["status"] == "used" and p["reason"]), None
        )
        if ov is not None:  # the version, the precision it computed in, which variants held their cache
            lines += [f"{ov['reason']}.", ""]
    if report.get("weights") == "random-init":
        lines += ["> weights: random-init (latency does not depend on weight values)", ""]
    lines += fastest(report)
    load = report.get("load")
    if load and load["loaded"]:
        lines += [
            f"> **Measured on a busy machine:** a GEMM loop got {load['cpu_share_before']:.0%} of the threads' CPU "
            f"time before the timed calls and {load['cpu_share_after']:.0%} after; another job ran, "
            "and every time below is slower than this machine is.",
            "",
        ]
    peaks = report.get("peaks")
    if peaks:
        lines += [
            f"Machine limits (measured once per CPU fingerprint, {peaks['threads']} threads): {limits_line(peaks)}.",
            "",
        ]
        if peaks.get("loaded"):
            lines += [
                f"> The limits were measured on a busy machine ({peaks['cpu_share']:.0%} of the threads' CPU time): "
                "they are low, and the next build measures them again.",
                "",
            ]
        if peaks.get("remeasured"):
            lines += [f"> A row beat the cached limits: {peaks['remeasured']}.", ""]
    bf16 = report.get("pytorch_bf16")
    if bf16 and bf16["status"] == "skipped":
        lines += [f"PyTorch bf16 not timed: {bf16['reason']}.", ""]
    lines += [
        "| variant | provider | shape | p50 | p90 | p99 | throughput/s | vs PyTorch fp32 | vs PyTorch bf16 "
        "| work | of the limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in report["baseline"]:
        shape = shape_text(b["shape"])
        dtype = b.get("dtype", "fp32")
        bf = next((x for x in report["baseline"] if x.get("dtype") == "bf16" and x["shape"] == b["shape"]), None)
        vs16 = f"{b['p50_ms'] / bf['p50_ms']:.2f}x" if bf else "-"
        fp = next(
            (x for x in report["baseline"] if x.get("dtype", "fp32") == "fp32" and x["shape"] == b["shape"]), None
        )
        vs32 = f"{b['p50_ms'] / fp['p50_ms']:.2f}x" if fp else "-"
        attention = b.get("attention")
        lines.append(
            f"| PyTorch {dtype} ({b['mode']}{', ' + attention if attention else ''}) "
            f"| - | {shape} | {format_ms(b['p50_ms'])} | {format_ms(b['p90_ms'])} | "
            f"{format_ms(b['p99_ms'])} | {b['throughput']:.1f} | {vs32} | {vs16} | {_work(b)} | {limit_text(b)} |"
        )
    for r in report["results"]:
        if "p50_ms" not in r:
            lines.append(
                f"| {r['variant']} | {r['provider']} | {shape_text(r['shape']) if r.get('shape') else '-'} | error: "
                f"{r.get('error')} | | | | | | | |"
            )
            continue
        bound = " (IOBinding)" if r.get("io_binding") else ""
        precision = f" ({r['inference_precision']})" if r.get("inference_precision") else ""
        if report.get("validated") and not _validated_on(report, r):
            precision += " (not validated here)"
        lines.append(
            f"| {r['variant']}{bound} | {_provider(r['provider'])}{precision} | {shape_text(r['shape'])} | "
            f"{format_ms(r['p50_ms'])} | {format_ms(r['p90_ms'])} | {format_ms(r['p99_ms'])} | "
            f"{r['throughput']:.1f} | {_ratio(r.get('ratio_to_pytorch'))} | {_ratio(r.get('ratio_to_pytorch_bf16'))} "
            f"| {_work(r)} | {limit_text(r)} |"
        )
    lines += [
        "",
        "vs PyTorch: p50 over PyTorch's p50 at the same shape (below 1.00x is faster). "
        "Work: matrix-product FLOPs counted from the graph at that shape and the weight bytes one call reads; "
        "of the limit: the roofline time (FLOPs at the peak for the row's precision, or weight bytes at the memory "
        "bandwidth, whichever is longer) over the measured p50.",
        "",
    ]
    if report.get("decode"):
        lines += [
            "",
            "## Generation (KV cache)",
            "",
            (
                "Encoder-decoder: prefill is the first token (the encoder, then the decoder's first step); "
                f"decode is one decoder step through a cache of {report['encoder_decoder']['cached_tokens']} tokens. "
                if report.get("encoder_decoder")
                else "Prefill: the prompt with an empty past. Decode: one new token after a past as long as the prompt "
                '(a row whose model holds its cache, "past a-b": successive tokens after it, '
                "the past running from a to b). "
            )
            + "Generate: prefill plus all new tokens, end to end (PyTorch: transformers generate()).",
            "",
            "| engine | variant | prompt | new tokens | prefill p50 | decode p50 | decode p90 | tokens/s "
            "| decode vs PyTorch fp32 | vs bf16 | decode: of the limit |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in report["decode"]:
            shape = ", ".join(f"{k}={v}" for k, v in d["shape"].items())
            ratio, ratio16 = _ratio(d.get("decode_ratio_to_pytorch")), _ratio(d.get("decode_ratio_to_pytorch_bf16"))
            if d["engine"] == "pytorch":  # bf16 against itself
                ratio16 = "1.00x" if d.get("dtype") == "bf16" else ratio16
            who = {"pytorch": f"PyTorch {d.get('dtype', 'fp32')} generate()", "openvino": "OpenVINO"}.get(
                d["engine"], f"ONNX Runtime ({_provider(d['provider'] or '')})"
            )
            lines.append(
                f"| {who} | {d['variant'] or '-'} | {shape} | {d['new_tokens']} | {format_ms(d['prefill_p50_ms'])} | "
                f"{format_ms(d['decode_p50_ms'])}{_past(d)} | "
                f"{format_ms(d['decode_p90_ms'])} | {d['tokens_per_s']:.1f} | {ratio} | {ratio16} | {limit_text(d)} |"
            )
    if report.get("kernels"):
        lines += [
            "",
            "## Where the time goes (ONNX Runtime's profiler, CPU provider)",
            "",
            "| variant | shape | one profiled call | kernels by time |",
            "|---|---|---|---|",
        ]
        for variant, k in report["kernels"].items():
            ops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in k["ops"]) or f"error: {k.get('error')}"
            lines.append(
                f"| {variant} | {shape_text(k['shape'])} | "
                f"{format_ms(k['run_ms']) if k.get('run_ms') else '-'} | {ops} |"
            )
    if report.get("openvino_kernels"):
        lines += [
            "",
            "## Where the time goes (OpenVINO's profiler)",
            "",
            "| variant | call | shape | profiled call (mean of 10) | node type (implementation): ms per call "
            "(share of the nodes' time) |",
            "|---|---|---|---|---|",
        ]
        for variant, entries in report["openvino_kernels"].items():
            for k in entries:
                ops = (
                    ", ".join(f"{o['op']} {format_ms(o['ms'])} ({o['share']:.0%})" for o in k["ops"])
                    or f"error: {k.get('error')}"
                )
                lines.append(
                    f"| {variant} | {k['call']} | {shape_text(k['shape'])} | "
                    f"{format_ms(k['run_ms']) if k.get('run_ms') else '-'} | {ops} |"
                )
    skipped = [p for p in report["providers"] if p["status"] == "skipped"]
    if skipped:
        lines += ["", "Providers skipped:"] + [f"- {p['name']}: {p['reason']}" for p in skipped]
    return "\n".join(lines) + "\n"


def shape_text(shape: dict[str, int]) -> str:
    """``batch=1, sequence=128``."""
    return ", ".join(f"{k}={v}" for k, v in shape.items())


def row_name(row: Mapping[str, object]) -> str:
    """A timed row as a reader names it: its variant, or, for the rows that carry none (the
    PyTorch baselines, prefill and decode), PyTorch and its dtype."""
    return str(row["variant"]) if "variant" in row else f"PyTorch {row.get('dtype', 'fp32')}"


def _provider(name: str) -> str:
    return name.replace("ExecutionProvider", "")


def _past(row: DecodeRow) -> str:
    """ " (past 128-135)" where a decode row's steps read a growing held cache, else nothing."""
    past = row.get("decode_past")
    return f" (past {past[0]}-{past[1]})" if past else ""


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x" if x >= 0.01 else f"{x:.4f}x"


def _work(row: Row) -> str:
    w = row.get("work")
    if not w:
        return "-"
    return f"{w['flops'] / 1e9:.3g} GFLOP, {w['weight_bytes'] / 1e6:.3g} MB"


def limit_text(row: Mapping[str, object]) -> str:
    """A row's share of its limit, for benchmark.md and report.html."""
    r = row.get("roofline")
    if not isinstance(r, dict) or not isinstance(r.get("fraction"), (int, float)):
        return "-"
    if r.get("over_limit"):  # the limit is wrong, not the row fast: never a bare "180%"
        return f"over the measured {r['limit']} limit ({r['fraction']:.0%}: the limit is low)"
    return f"{r['fraction']:.0%} of {r['limit']}"


def limits_line(peaks: Mapping[str, object]) -> str:
    """The measured peaks in one line: fp32 340 GFLOP/s, bf16 1630 GFLOP/s, ..."""
    parts = [f"fp32 GEMM {peaks['fp32_gflops']:.0f} GFLOP/s"]
    parts.append(
        f"bf16 GEMM {peaks['bf16_gflops']:.0f} GFLOP/s" if peaks.get("bf16_gflops") else "bf16: no native support"
    )
    int8 = peaks.get("int8_gops")
    how = peaks.get("how")
    plain = isinstance(how, Mapping) and "dot-product" in str(how.get("int8_gops", ""))
    if isinstance(int8, (int, float)):
        slower = int8 < float(peaks["fp32_gflops"])  # type: ignore[arg-type]
        why = "int8 compute without dot-product instructions" if plain else "int8 compute"
        parts.append(f"int8 GEMM {int8:.0f} GOP/s" + (f" ({why} is slower than fp32 here)" if slower else ""))
    else:
        parts.append("int8: not measured")
    parts.append(f"memory {peaks['memory_gbps']:.1f} GB/s")
    return ", ".join(parts)


def validated_on(report: Mapping[str, object], row: Mapping[str, object]) -> bool:
    """Whether the row's variant was validated on the row's provider (``validated`` lists them)."""
    return _validated_on(_checked(report), row)


def _validated_on(report: BenchmarkReport, row: Mapping[str, object]) -> bool:
    provider, variant = row["provider"], row["variant"]
    # variant: a string, or null on a decode row (validated names no null variant)
    return isinstance(variant, str) and provider in (report.get("validated") or {}).get(variant, [])


def _timed(report: BenchmarkReport) -> list[Row]:
    return [r for r in report["results"] if "p50_ms" in r and not r.get("io_binding")]


def fastest_row(report: BenchmarkReport, shape: dict[str, int]) -> Row | None:
    """The fastest row at ``shape`` whose (variant, provider) was validated (any row where the
    recipe validates nothing), or None."""
    here = [r for r in _timed(report) if r["shape"] == shape]
    return min(
        (r for r in here if not report.get("validated") or _validated_on(report, r)),
        key=lambda r: r["p50_ms"],
        default=None,
    )


def fastest(report: BenchmarkReport) -> list[str]:
    """The lead: per shape, the fastest (variant, provider) whose validation ran on that provider."""
    rows = _timed(report)
    if not rows:
        return []
    shapes = {json.dumps(r["shape"], sort_keys=True): r["shape"] for r in rows}  # in first-seen order
    out = []
    for shape in shapes.values():
        best = fastest_row(report, shape)
        if best is None:
            out.append(f"- {shape_text(shape)}: no validated (variant, provider) was timed")
            continue
        against = [
            f"{x:.2f}x PyTorch {t}"
            for x, t in ((best.get("ratio_to_pytorch"), "fp32"), (best.get("ratio_to_pytorch_bf16"), "bf16"))
            if x
        ]
        limit = f", {limit_text(best)}" if best.get("roofline") else ""
        out.append(
            f"- {shape_text(best['shape'])}: **{best['variant']} on {_provider(best['provider'])}** "
            f"{format_ms(best['p50_ms'])}"
            + (f" ({', '.join(against)}{limit})" if against or limit else "")
            + _its_decode(report, best)
            + _quality(report, best["variant"])
        )
    if not report.get("validated"):
        return [
            "Fastest per shape (no source model to validate against: check is this recipe's gate):",
            "",
            *(line.replace("no validated", "no") for line in out),
            "",
        ]
    return ["Fastest validated (variant, provider) per shape:", "", *out, ""]


def _quality(report: BenchmarkReport, variant: str) -> str:
    """The variant's quality on validate.text, beside its speed (where the recipe measures text)."""
    q = (report.get("quality") or {}).get(variant)
    if not q:
        return ""
    verdict = "" if q["passed"] else "; its validation FAILED"
    return (
        f"; on text: perplexity {q['perplexity']:.3f} ({q['ppl_increase']:+.2%} vs PyTorch), "
        f"mean KL {q['kld_mean']:.4f}, top-1 {q['top1_agreement']:.3f}{verdict}"
    )


def _its_decode(report: BenchmarkReport, best: Row) -> str:
    """For a decoder, the prefill winner's own decode step beside the fastest validated one at
    the same shape: the file that prefills fastest need not decode fastest, and a reader picking
    one (variant, provider) pays both."""
    shape = json.dumps(best["shape"], sort_keys=True)
    steps = [
        d
        for d in report.get("decode") or []
        if d["engine"] != "pytorch"
        and "decode_p50_ms" in d
        and json.dumps(d["shape"], sort_keys=True) == shape
        and (not report.get("validated") or _validated_on(report, d))
    ]
    own = next((d for d in steps if (d["variant"], d["provider"]) == (best["variant"], best["provider"])), None)
    if own is None:
        return ""
    top = min(steps, key=lambda d: d["decode_p50_ms"])
    if top is own:
        return (
            f"; its decode step {format_ms(own['decode_p50_ms'])}, "
            f"the fastest{' validated' if report.get('validated') else ''} decode"
        )
    return (
        f"; its decode step {format_ms(own['decode_p50_ms'])}, "
        f"{own['decode_p50_ms'] / top['decode_p50_ms']:.2f}x the fastest"
        f"{' validated' if report.get('validated') else ''} decode ({top['variant']} on "
        f"{_provider(top['provider'] or '')} {format_ms(top['decode_p50_ms'])})"
    )


def chart(report_: Mapping[str, object], path: Path) -> None:
    report = _checked(report_)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "p50_ms" in r]
    shapes = sorted(
        {json.dumps(r["shape"], sort_keys=True) for r in rows}
        | {json.dumps(b["shape"], sort_keys=True) for b in report["baseline"]}
    )
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(5 * max(1, len(shapes)), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        labels, values, colours = [], [], []
        for b in report["baseline"]:
            if json.dumps(b["shape"], sort_keys=True) == shape:
                labels.append(f"PyTorch\n{b.get('dtype', 'fp32')}")
                values.append(b["p50_ms"])
                colours.append("#888888")
        for r in rows:
            if json.dumps(r["shape"], sort_keys=True) == shape:
                labels.append(f"{r['variant']}\n{r['provider'].replace('ExecutionProvider', '')}")
                values.append(r["p50_ms"])
                colours.append("#2a6fdb")
        ax.bar(range(len(values)), values, color=colours)
        ax.set_xticks(range(len(values)), labels, fontsize=8)
        ax.set_ylabel("p50 latency (ms)")
        ax.set_title(", ".join(f"{k}={v}" for k, v in json.loads(shape).items()), fontsize=9)
        for i, v in enumerate(values):
            ax.annotate(format_ms(v), (i, v), ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"{report['recipe']}: p50 latency per variant (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
