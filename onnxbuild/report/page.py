"""``report.html``: one self-contained page per artifact folder, for people rather than tools.

The JSON files beside it are the record; this page is what a reviewer opens first. It is
rendered from the folder alone (manifest.json, timings.json, reports/*.json,
benchmark.json and .png), as a pure function, so ``onnxbuild report`` can rewrite it at
any time and a test can render a folder written by hand. No network: CSS is inline and the
chart is the benchmark's PNG as a data URI. Every section tolerates a missing or damaged
file (it says so and moves on), because a failed build needs its report most.

One module (~560 lines): the inline CSS and one small renderer per section, in page order,
plus the diff page that shares them.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import TypeVar

from onnxbuild._util import atomic_write_text, format_ms
from onnxbuild.report.benchmark import limit_text
from onnxbuild.report.diffview import RecipeDiff, model_lines, show, summary_line
from onnxbuild.report.pagekey import page_key, with_marker

V = TypeVar("V")

CSS = """
:root { --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700; --muted: #57606a; --line: #d0d7de; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub { color: var(--muted); margin-bottom: 16px; }
.banner { border-radius: 8px; padding: 14px 18px; margin: 12px 0; font-size: 16px; border: 1px solid; }
.banner.ok { background: #dafbe1; border-color: #4ac26b; } .banner.bad { background: #ffebe9; border-color: #ff8182; }
.banner.warn { background: #fff8c5; border-color: #d4a72c; font-size: 14px; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 10px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.pass { color: var(--ok); font-weight: 600; } .fail { color: var(--bad); font-weight: 700; } .skip { color: var(--warn); }
tr.failed td { background: #fff5f5; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--muted); }
img.chart { max-width: 100%; border: 1px solid var(--line); border-radius: 6px; }
.note { color: var(--muted); }
"""  # noqa: E501


def write_report(folder: Path) -> Path:
    """Write ``folder/report.html`` (atomically; never through a link) and return its path."""
    from onnxbuild.errors import UsageError

    path = folder / "report.html"
    if path.is_symlink():
        path.unlink()  # replaced by a file of ours, never written through
    elif path.is_dir():
        raise UsageError(f"{path} is a folder where onnxbuild writes report.html; move it away and build again")
    atomic_write_text(path, render_report(folder))
    return path


def render_report(folder: Path) -> str:
    """The page for an artifact folder, from its files alone."""
    manifest = _read(folder / "manifest.json")
    timings = _read(folder / "timings.json")
    name = manifest.get("name") if isinstance(manifest, dict) else None
    title = str(name or folder.name)
    parts = [
        _guard("verdict", "manifest.json or timings.json", lambda: _verdict(folder, manifest, timings)),
        _guard(
            "validation", "reports/validation.json", lambda: _validation(_read(folder / "reports" / "validation.json"))
        ),
        _guard(
            "generation", "reports/generation.json", lambda: _generation(_read(folder / "reports" / "generation.json"))
        ),
        _guard("benchmark", "benchmark.json", lambda: _benchmark(folder, _read(folder / "benchmark.json"))),
        _guard("variants", "manifest.json or reports/optimize.json", lambda: _variants(folder, manifest)),
        _guard("steps", "manifest.json or timings.json", lambda: _steps(manifest, timings)),
        _guard("versions", "manifest.json", lambda: _versions(manifest)),
        _guard("digests", "manifest.json", lambda: _digests(manifest)),
    ]
    recipe = manifest.get("recipe", {}) if isinstance(manifest, dict) else {}
    where = escape(str(recipe.get("path", ""))) if isinstance(recipe, dict) else ""
    rest = (
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}: onnxbuild report</title>'
        f"<style>{CSS}</style></head><body><main>\n<h1>{escape(title)}</h1>\n"
        '<div class="sub">onnxbuild report of '
        f"<code>{escape(str(folder))}/</code>{' from <code>' + where + '</code>' if where else ''}</div>\n"
        + "\n".join(p for p in parts if p)
        + "\n</main></body></html>\n"
    )
    return with_marker(page_key(folder), "<!DOCTYPE html>", rest)


# ---------------------------------------------------------------- sections


def _verdict(folder: Path, manifest: object, timings: object) -> str:
    steps = timings.get("steps", {}) if isinstance(timings, dict) and isinstance(timings.get("steps"), dict) else {}
    failed = [(n, s) for n, s in steps.items() if isinstance(s, dict) and s.get("status") == "failed"]
    skipped = [n for n, s in steps.items() if isinstance(s, dict) and s.get("status") == "skipped"]
    if not isinstance(manifest, dict):
        head = (
            '<div class="banner bad"><b>No manifest</b>: manifest.json is missing or unreadable; '
            "build with <code>onnxbuild make</code>.</div>"
        )
    elif failed:
        lines = "".join(f"<li><b>{escape(n)}</b> failed: {escape(str(s.get('reason', '')))}</li>" for n, s in failed)
        also = f"<div>skipped: {escape(', '.join(skipped))}</div>" if skipped else ""
        head = f'<div class="banner bad"><b>Build FAILED</b><ul>{lines}</ul>{also}</div>'
    else:
        validation = _read(folder / "reports" / "validation.json")
        valid = (
            ""
            if not isinstance(validation, dict)
            else (" Validation passed." if validation.get("passed") else " Validation FAILED.")
        )
        cls = "bad" if isinstance(validation, dict) and not validation.get("passed") else "ok"
        head = (
            f'<div class="banner {cls}"><b>{"Build OK" if cls == "ok" else "Build FAILED"}</b>: '
            f"{len(steps)} steps built or cached.{valid}</div>"
        )
    weights = _weights(folder, manifest)
    return f'<section id="verdict">{head}{weights}</section>'


def _weights(folder: Path, manifest: object) -> str:
    source = _read(folder / "reports" / "source.json")
    weights = why = ""
    if isinstance(source, dict):
        weights, why = str(source.get("weights", "")), str(source.get("why", ""))
    if not weights and isinstance(manifest, dict):
        for step in manifest.get("steps", []) if isinstance(manifest.get("steps"), list) else []:
            data = step.get("data", {}) if isinstance(step, dict) else {}
            if isinstance(data, dict) and data.get("weights"):
                weights, why = str(data["weights"]), str(data.get("why", ""))
    if weights == "random-init":
        return (
            f'<div class="banner warn"><b>random-init weights</b> ({escape(why or "seeded")}): '
            "every figure here compares the export with its source, not a trained model.</div>"
        )
    return (
        f'<div class="note">weights: {escape(weights)}{" (" + escape(why) + ")" if why else ""}</div>'
        if weights
        else ""
    )


def _validation(report: object) -> str:
    if report is None:
        return ""
    if not isinstance(report, dict) or not isinstance(report.get("variants"), dict):
        return (
            '<section id="validation"><h2>Validation</h2><p class="note">reports/validation.json is '
            "unreadable.</p></section>"
        )
    rows, details = [], []
    for variant, v in _variant_order(report["variants"]):
        if not isinstance(v, dict):
            continue
        tol = (
            f"atol {v.get('atol', '?'):g}, rtol {v.get('rtol', '?'):g}"
            if isinstance(v.get("atol"), (int, float)) and isinstance(v.get("rtol"), (int, float))
            else "-"
        )
        for r in v.get("shapes", []) if isinstance(v.get("shapes"), list) else []:
            outputs = r.get("outputs", {}) if isinstance(r.get("outputs"), dict) else {}
            ok = (
                bool(r.get("passed"))
                and not r.get("error")
                and all(isinstance(c, dict) and c.get("passed") for c in outputs.values())
            )
            worst = _worst(outputs)
            diff = _sci(outputs[worst].get("max_abs_diff")) if worst else "-"
            top1 = r.get("top1_agreement")
            shape = _shape(r.get("shape"))
            error = f" {escape(str(r['error']))}" if r.get("error") else ""
            rows.append(
                f'<tr data-variant="{escape(variant)}" class="{"" if ok else "failed"}"><td>{escape(variant)}</td>'
                f"<td>{escape(shape)}</td><td>{escape(worst or '-')}</td>"
                f'<td class="num">{diff}</td><td>{escape(tol)}</td>'
                f'<td class="num">{"-" if top1 is None else f"{top1:.3f}"}</td><td>{_mark(ok)}{error}</td></tr>'
            )
            for out in sorted(outputs, key=_natural):
                c = outputs[out]
                if isinstance(c, dict):
                    details.append(
                        f"<tr><td>{escape(variant)}</td><td>{escape(shape)}</td><td>{escape(out)}</td>"
                        f'<td class="num">{_sci(c.get("max_abs_diff"))}</td>'
                        f'<td class="num">{_sci(c.get("max_rel_diff"))}</td>'
                        f"<td>{_mark(bool(c.get('passed')))}</td></tr>"
                    )
    gates = []
    for variant, v in _variant_order(report["variants"]):
        t = v.get("top1") if isinstance(v, dict) else None
        if isinstance(t, dict) and isinstance(t.get("agreement"), (int, float)):
            gates.append(
                f"<li>{escape(variant)}: top-1 agreement {t['agreement']:.3f} over "
                f"{escape(str(t.get('tokens', '?')))} tokens (floor {escape(str(t.get('min')))}) "
                f"{_mark(bool(t.get('passed')))}</li>"
            )
        q = v.get("text") if isinstance(v, dict) else None
        if isinstance(q, dict) and isinstance(q.get("perplexity"), (int, float)):
            gates.append(
                f"<li>{escape(variant)}: on text ({escape(str(q.get('text')))}, {escape(str(q.get('predictions')))} "
                f"predictions): perplexity {q['perplexity']:.3f} "
                f"({q.get('ppl_increase', 0):+.2%} vs PyTorch {q.get('perplexity_reference', 0):.3f}), "
                f"mean KL {q.get('kld_mean', 0):.4f}, top-1 {q.get('top1_agreement', 0):.3f} "
                f"{_mark(bool(q.get('passed')))}</li>"
            )
        a = v.get("accuracy") if isinstance(v, dict) else None
        if isinstance(a, dict) and isinstance(a.get("onnxruntime"), (int, float)):
            gates.append(
                f"<li>{escape(variant)}: accuracy ONNX Runtime {a['onnxruntime']:.4f} vs source "
                f"{a.get('pytorch', 0):.4f} on {escape(str(a.get('samples', '?')))} samples "
                f"{_mark(bool(a.get('passed')))}</li>"
            )
    head = (
        "<tr><th>variant</th><th>shape</th><th>worst output</th><th>max abs diff</th><th>tolerance</th><th>top-1</th>"
        "<th>result</th></tr>"
    )
    return (
        f'<section id="validation"><h2>Validation against the source model: {_mark(bool(report.get("passed")))}</h2>'
        f"<table>{head}{''.join(rows)}</table>{'<ul>' + ''.join(gates) + '</ul>' if gates else ''}"
        f"<details><summary>every output at every shape ({len(details)} comparisons)</summary><table><tr>"
        "<th>variant</th><th>shape</th><th>output</th><th>max abs diff</th><th>max rel diff</th><th>result</th>"
        f"</tr>{''.join(details)}</table></details></section>"
    )


def _generation(report: object) -> str:
    if not isinstance(report, dict) or not isinstance(report.get("variants"), dict):
        return ""
    rows = []
    for variant, v in _variant_order(report["variants"]):
        greedy = v.get("greedy", {}) if isinstance(v, dict) and isinstance(v.get("greedy"), dict) else {}
        agreement = greedy.get("agreement")
        forced = v.get("teacher_forced_agreement") if isinstance(v, dict) else None
        first = greedy.get("first_divergence")
        rule = str(v.get("rule", "")) if isinstance(v, dict) else ""
        rows.append(
            f'<tr data-variant="{escape(variant)}"><td>{escape(variant)}</td>'
            f"<td>{'identical' if greedy.get('identical') else 'differs'}</td>"
            f'<td class="num">{"-" if first is None else escape(str(first))}</td>'
            f'<td class="num">{"-" if agreement is None else f"{agreement:.3f}"}</td>'
            f'<td class="num">{f"{forced:.3f}" if isinstance(forced, (int, float)) else "-"}</td>'
            f'<td class="num">{_sci(greedy.get("logits_max_abs_diff"))}</td><td>{_mark(bool(v.get("passed")))} '
            f'<span class="note">{escape(rule)}</span></td></tr>'
        )
    return (
        f'<section id="generation"><h2>Generation: {escape(str(report.get("max_new_tokens", "?")))} greedy tokens '
        "against transformers&#39; generate()</h2>"
        '<div class="note">Free-running tokens diverge for good after the first different one; '
        "teacher-forced agreement feeds both the same prefix at every step.</div>"
        "<table><tr><th>variant</th><th>tokens</th><th>first divergence</th><th>free-running agreement</th>"
        "<th>teacher-forced agreement</th><th>logits max abs diff</th><th>result</th></tr>"
        + "".join(rows)
        + "</table></section>"
    )


def _benchmark(folder: Path, report: object) -> str:
    if report is None:
        return ""
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        return '<section id="benchmark"><h2>Benchmark</h2><p class="note">benchmark.json is unreadable.</p></section>'
    machine = report.get("machine", {}) if isinstance(report.get("machine"), dict) else {}
    rows = []
    for b in report.get("baseline", []) if isinstance(report.get("baseline"), list) else []:
        if isinstance(b, dict):
            fp32 = b.get("dtype", "fp32") == "fp32"
            rows.append(
                f'<tr class="baseline"><td>PyTorch {escape(str(b.get("dtype", "fp32")))} '
                f"({escape(str(b.get('mode', '')))})</td><td>-</td><td>{escape(_shape(b.get('shape')))}</td>"
                f'<td class="num">{format_ms(b.get("p50_ms"))}</td><td class="num">{format_ms(b.get("p90_ms"))}</td>'
                f'<td class="num">{"1.00x" if fp32 else "-"}</td><td class="num">{"-" if fp32 else "1.00x"}</td>'
                f"<td>{escape(limit_text(b))}</td></tr>"
            )
    for r in report["results"]:
        if not isinstance(r, dict):
            continue
        ratio, ratio16 = r.get("ratio_to_pytorch"), r.get("ratio_to_pytorch_bf16")
        provider = (
            str(r.get("provider", "")).replace("ExecutionProvider", "")
            + (" (IOBinding)" if r.get("io_binding") else "")
            + (f" {r['inference_precision']}" if r.get("inference_precision") else "")
        )
        if "p50_ms" not in r:
            rows.append(
                f'<tr data-variant="{escape(str(r.get("variant")))}" class="failed">'
                f"<td>{escape(str(r.get('variant')))}</td><td>{escape(provider)}</td>"
                f'<td>{escape(_shape(r.get("shape")))}</td><td colspan="5">error: '
                f"{escape(str(r.get('error')))}</td></tr>"
            )
            continue
        rows.append(
            f'<tr data-variant="{escape(str(r.get("variant")))}"><td>{escape(str(r.get("variant")))}</td>'
            f"<td>{escape(provider)}</td><td>{escape(_shape(r.get('shape')))}</td>"
            f'<td class="num">{format_ms(r.get("p50_ms"))}</td><td class="num">{format_ms(r.get("p90_ms"))}</td>'
            f'<td class="num">{"-" if not ratio else f"{ratio:.2f}x"}</td>'
            f'<td class="num">{"-" if not ratio16 else f"{ratio16:.2f}x"}</td><td>{escape(limit_text(r))}</td></tr>'
        )
    decode = []
    for d in report.get("decode", []) if isinstance(report.get("decode"), list) else []:
        if isinstance(d, dict):
            who = (
                f"PyTorch {d.get('dtype', 'fp32')} generate()"
                if d.get("engine") == "pytorch"
                else f"{d.get('variant')} ({str(d.get('provider') or '').replace('ExecutionProvider', '')})"
            )
            decode.append(
                f"<tr><td>{escape(who)}</td><td>{escape(_shape(d.get('shape')))}</td>"
                f'<td class="num">{format_ms(d.get("prefill_p50_ms"))}</td>'
                f'<td class="num">{format_ms(d.get("decode_p50_ms"))}</td>'
                f'<td class="num">{escape(str(d.get("tokens_per_s", "-")))}</td><td>{escape(limit_text(d))}</td></tr>'
            )
    png = folder / "benchmark.png"
    chart = ""
    if png.is_file() and not png.is_symlink() and png.stat().st_size < 8 << 20:
        chart = (
            '<img class="chart" alt="p50 latency per variant" '
            f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode("ascii")}">'
        )
    skipped = [p for p in report.get("providers", []) if isinstance(p, dict) and p.get("status") == "skipped"]
    notes = "".join(
        f'<li class="skip">{escape(str(p.get("name")))} skipped: {escape(str(p.get("reason")))}</li>' for p in skipped
    )
    return (
        f'<section id="benchmark"><h2>Benchmark</h2><div class="note">{escape(str(machine.get("cpu", "?")))}, '
        f"{escape(str(machine.get('cores', '?')))} cores, {escape(str(machine.get('threads', '?')))} threads; "
        f"PyTorch measured in the same run.</div>{chart}"
        "<table><tr><th>variant</th><th>provider</th><th>shape</th><th>p50</th><th>p90</th><th>vs PyTorch fp32</th>"
        "<th>vs PyTorch bf16</th><th>of the limit</th></tr>"
        + "".join(rows)
        + "</table>"
        + (
            "<table><tr><th>decoder</th><th>prompt</th><th>prefill p50</th><th>decode p50</th><th>tokens/s</th>"
            "<th>decode: of the limit</th></tr>" + "".join(decode) + "</table>"
            if decode
            else ""
        )
        + (f"<ul>{notes}</ul>" if notes else "")
        + "</section>"
    )


def _variants(folder: Path, manifest: object) -> str:
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps"), list):
        return ""
    rows = []
    for step in manifest["steps"]:
        if not isinstance(step, dict):
            continue
        for o in step.get("outputs", []) if isinstance(step.get("outputs"), list) else []:
            if isinstance(o, dict) and str(o.get("path", "")).endswith(".onnx"):
                path = str(o["path"])
                variant = (
                    "model" if "/" not in path else path.split("/")[0]
                )  # an encoder-decoder's two files are both "model"
                report = _read(folder / "reports" / "optimize.json") if variant == "optimized" else None
                fused = (
                    ", ".join(f"{k} x{v}" for k, v in sorted((report or {}).get("fused_ops", {}).items()))
                    if isinstance(report, dict)
                    else ""
                )
                rows.append(
                    f'<tr data-variant="{escape(variant)}"><td>{escape(variant)}</td><td><code>{escape(path)}</code>'
                    f'</td><td class="num">{_size(o.get("bytes"))}</td><td>{escape(fused or "-")}</td></tr>'
                )
    check = _read(folder / "reports" / "check.json")
    described = (
        "model.onnx"
        if (folder / "model.onnx").is_file() or not (folder / "decoder_model.onnx").is_file()
        else "decoder_model.onnx"
    )
    about = (
        f'<div class="note">{described}: {escape(str(check.get("nodes")))} nodes, {check.get("parameters", 0):,} '
        f"parameters, IR {escape(str(check.get('ir_version')))}</div>"
        if isinstance(check, dict) and isinstance(check.get("parameters"), int)
        else ""
    )
    if not rows:
        return ""
    return (
        f'<section id="variants"><h2>Variants</h2>{about}<table><tr><th>variant</th><th>file</th><th>size</th>'
        f"<th>fused ops</th></tr>{''.join(rows)}</table></section>"
    )


def _steps(manifest: object, timings: object) -> str:
    steps = timings.get("steps", {}) if isinstance(timings, dict) and isinstance(timings.get("steps"), dict) else {}
    order = (
        [s.get("name") for s in manifest.get("steps", []) if isinstance(s, dict)]
        if isinstance(manifest, dict) and isinstance(manifest.get("steps"), list)
        else []
    )
    order += [n for n in steps if n not in order]
    if not order:
        return ""
    rows = []
    for name in order:
        t = steps.get(name, {}) if isinstance(steps.get(name), dict) else {}
        status = str(t.get("status") or "-")
        cls = {"built": "pass", "cached": "note", "failed": "fail", "skipped": "skip"}.get(status, "")
        seconds = t.get("seconds")
        rows.append(
            f'<tr><td>{escape(str(name))}</td><td class="{cls}">{escape(status)}</td>'
            f'<td class="num">{"" if not seconds else f"{seconds:.1f} s"}</td>'
            f"<td>{escape(str(t.get('reason') or ''))}</td></tr>"
        )
    return (
        '<section id="steps"><h2>Steps (this run)</h2><table><tr><th>step</th><th>status</th><th>time</th><th>why</th>'
        f"</tr>{''.join(rows)}</table></section>"
    )


def _versions(manifest: object) -> str:
    if not isinstance(manifest, dict):
        return ""
    pairs = (
        [*(manifest.get("versions") or {}).items(), *(manifest.get("platform") or {}).items()]
        if isinstance(manifest.get("versions"), dict) and isinstance(manifest.get("platform"), dict)
        else []
    )
    cells = "".join(f"<tr><td>{escape(str(k))}</td><td><code>{escape(str(v))}</code></td></tr>" for k, v in pairs)
    return f'<section id="versions"><h2>Versions</h2><table>{cells}</table></section>' if cells else ""


def _digests(manifest: object) -> str:
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps"), list):
        return ""
    rows = []
    for step in manifest["steps"]:
        if isinstance(step, dict):
            for o in step.get("outputs", []) if isinstance(step.get("outputs"), list) else []:
                if isinstance(o, dict):
                    rows.append(
                        f"<tr><td><code>{escape(str(o.get('path')))}</code></td>"
                        f'<td>{escape(str(step.get("name")))}</td><td class="num">{_size(o.get("bytes"))}</td>'
                        f'<td class="mono">{escape(str(o.get("sha256")))}</td></tr>'
                    )
    recipe = manifest["recipe"] if isinstance(manifest.get("recipe"), dict) else {}
    return (
        '<section id="digests"><h2>Digests</h2><div class="note">recipe sha256 '
        f"<code>{escape(str(recipe.get('digest', '?')))}</code></div>"
        f"<details><summary>{len(rows)} files</summary><table><tr><th>file</th><th>step</th><th>size</th>"
        f"<th>sha256</th></tr>{''.join(rows)}</table></details></section>"
    )


def render_diff(base: str, diffs: list[RecipeDiff]) -> str:
    """``onnxbuild diff --format html``: the same look, one section per changed recipe."""
    sections = []
    for d in diffs:
        cls = "bad" if d.error else ("ok" if d.status == "unchanged" else "warn")
        parts = [f'<div class="banner {cls}"><code>{escape(d.path)}</code>: <b>{escape(d.status)}</b></div>']
        if d.error:
            parts.append(f"<pre>{escape(d.error)}</pre>")
        if d.changes:
            rows = "".join(
                f"<tr><td><code>{escape(k)}</code></td><td>{escape(show(a))}</td><td>{escape(show(b))}</td></tr>"
                for k, a, b in d.changes
            )
            parts.append(f"<table><tr><th>key</th><th>base</th><th>working tree</th></tr>{rows}</table>")
        if d.invalidated:
            parts.append(f"<p>Steps that rebuild: {escape(', '.join(d.invalidated))}</p>")
        if d.metrics:
            rows = "".join(
                f'<tr><td>{escape(m.what)}</td><td class="num">{escape(m.shown(m.base))}</td>'
                f'<td class="num">{escape(m.change)}</td></tr>'
                for m in d.metrics
            )
            parts.append(f"<table><tr><th>figure</th><th>base</th><th>working tree</th></tr>{rows}</table>")
        elif d.figures:
            parts.append(f'<p class="note">Figures: {escape(d.figures)}.</p>')
        if d.models:
            rows = "".join(
                f"<tr><td><code>{escape(m.path)}</code></td><td>{escape(r.what)}</td>"
                f'<td class="num">{escape(r.shown(r.base))}</td><td class="num">{escape(r.shown(r.now))}</td></tr>'
                for m in d.models
                for r in model_lines(m)
            )
            parts.append(
                "<h3>Model files</h3><table><tr><th>file</th><th>what</th><th>base</th><th>working tree</th>"
                f"</tr>{rows}</table>"
            )
        sections.append(f'<section class="recipe">{"".join(parts)}</section>')
    if sections:
        sections.insert(0, f"<p><b>{escape(summary_line(diffs))}</b></p>")
    body = "\n".join(sections) or "<p>No recipe changed.</p>"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>onnxbuild diff</title>'
        f"<style>{CSS}</style></head><body><main>"
        f'<h1>onnxbuild diff</h1><div class="sub">against <code>{escape(base[:12])}</code></div>\n{body}\n</main>'
        "</body></html>\n"
    )


# ---------------------------------------------------------------- helpers


def _guard(section: str, source: str, render: Callable[[], str]) -> str:
    """A section, or a note in its place when its file parses but holds the wrong types
    (a string where a number belongs): the page is most needed when something is off."""
    try:
        return render()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        return (
            f'<section id="{section}"><h2>{section.capitalize()}</h2><p class="note">{escape(source)} has unexpected '
            f"content ({escape(type(exc).__name__)}); section skipped.</p></section>"
        )


def _read(path: Path) -> object:
    """A JSON file's contents, or None when it is missing, not a regular file, or damaged.

    object, not a TypedDict: the folder may hold a damaged or hand-written file, so every
    section narrows with isinstance (and :func:`_guard` catches what it did not)."""
    from onnxbuild._util import read_regular_text

    try:
        return json.loads(read_regular_text(path, limit=64 << 20))
    except (OSError, ValueError, RecursionError):
        return None


def _variant_order(variants: dict[str, V]) -> list[tuple[str, V]]:
    return sorted(variants.items(), key=lambda kv: {"model": 0, "optimized": 1}.get(kv[0], 2))


def _natural(name: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _worst(outputs: dict[str, object]) -> str | None:
    failed = sorted((n for n, c in outputs.items() if isinstance(c, dict) and not c.get("passed")), key=_natural)
    if failed:
        return failed[0]
    diffs = [
        (c["max_abs_diff"], n)
        for n, c in outputs.items()
        if isinstance(c, dict) and isinstance(c.get("max_abs_diff"), (int, float))
    ]
    return max(diffs)[1] if diffs else None


def _mark(ok: bool) -> str:
    return '<span class="pass">pass</span>' if ok else '<span class="fail">FAIL</span>'


def _sci(x: object) -> str:
    return f"{x:.2e}" if isinstance(x, (int, float)) else "-"


def _shape(shape: object) -> str:
    return ", ".join(f"{k}={v}" for k, v in shape.items()) if isinstance(shape, dict) else "-"


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"
