"""benchmark.json as people read it: the Markdown table and the latency chart (pure
functions of the report; matplotlib is imported only to draw)."""

from __future__ import annotations

import json
from typing import Any

from onnxbuild._util import format_ms


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# {report['recipe']}: benchmark",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads; warmup {report['settings']['warmup']}, "
        f"at least {report['settings']['iterations']} iterations. PyTorch baseline measured in the same run.",
        "",
    ]
    if report.get("weights") == "random-init":
        lines += ["> weights: random-init (latency does not depend on weight values)", ""]
    lines += ["| variant | provider | shape | p50 | p90 | p99 | mean | throughput/s | vs PyTorch p50 |", "|---|---|---|---|---|---|---|---|---|"]
    for b in report["baseline"]:
        shape = ", ".join(f"{k}={v}" for k, v in b["shape"].items())
        lines.append(f"| PyTorch ({b['mode']}{', ' + b['attention'] if b.get('attention') else ''}) | - | {shape} | {format_ms(b['p50_ms'])} | {format_ms(b['p90_ms'])} | {format_ms(b['p99_ms'])} | {format_ms(b['mean_ms'])} | {b['throughput']:.1f} | 1.00x |")
    for r in report["results"]:
        if "p50_ms" not in r:
            lines.append(f"| {r['variant']} | {r['provider']} | {r.get('shape', '-')} | error: {r.get('error')} | | | | | |")
            continue
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        ratio = f"{r['ratio_to_pytorch']:.2f}x" if r.get("ratio_to_pytorch") else "-"
        bound = " (IOBinding)" if r.get("io_binding") else ""
        lines.append(f"| {r['variant']}{bound} | {r['provider'].replace('ExecutionProvider', '')} | {shape} | {format_ms(r['p50_ms'])} | {format_ms(r['p90_ms'])} | {format_ms(r['p99_ms'])} | {format_ms(r['mean_ms'])} | {r['throughput']:.1f} | {ratio} |")
    if report.get("decode"):
        lines += [
            "",
            "## Generation (KV cache)",
            "",
            (
                "Encoder-decoder: prefill is the first token (the encoder, then the decoder's first step); decode is one "
                f"decoder step through a cache of {report['encoder_decoder']['cached_tokens']} tokens. "
                if report.get("encoder_decoder")
                else "Prefill: the prompt with an empty past. Decode: one new token after a past as long as the prompt. "
            )
            + "Generate: prefill plus all new tokens, end to end (PyTorch: transformers generate()).",
            "",
            "| engine | variant | prompt | new tokens | prefill p50 | decode p50 | decode p90 | tokens/s | decode vs PyTorch |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for d in report["decode"]:
            shape = ", ".join(f"{k}={v}" for k, v in d["shape"].items())
            ratio = f"{d['decode_ratio_to_pytorch']:.2f}x" if d.get("decode_ratio_to_pytorch") else "-"
            who = "PyTorch generate()" if d["engine"] == "pytorch" else f"ONNX Runtime ({(d['provider'] or '').replace('ExecutionProvider', '')})"
            lines.append(f"| {who} | {d['variant'] or '-'} | {shape} | {d['new_tokens']} | {format_ms(d['prefill_p50_ms'])} | {format_ms(d['decode_p50_ms'])} | {format_ms(d['decode_p90_ms'])} | {d['tokens_per_s']:.1f} | {ratio} |")
    skipped = [p for p in report["providers"] if p["status"] == "skipped"]
    if skipped:
        lines += ["", "Providers skipped:"] + [f"- {p['name']}: {p['reason']}" for p in skipped]
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "p50_ms" in r]
    shapes = sorted({json.dumps(r["shape"], sort_keys=True) for r in rows} | {json.dumps(b["shape"], sort_keys=True) for b in report["baseline"]})
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=(5 * max(1, len(shapes)), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        labels, values, colours = [], [], []
        for b in report["baseline"]:
            if json.dumps(b["shape"], sort_keys=True) == shape:
                labels.append("PyTorch")
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
