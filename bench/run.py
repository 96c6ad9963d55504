"""Benchmarks that print figures (not timed tests): `make bench`.

1. No-op build: wall time of `onnxbuild make` on an already-built recipe (target < 0.3 s).
2. GPT-2 small cold build (source, export, check, validate) from an empty cache:
   wall time (target < 3 min) and peak memory of any step process (target < 4 GB).
3. Export overhead: the export step through onnxbuild vs a bare torch.onnx.export
   script of the same model in one run (target < 10 %).
4. Whisper-tiny's greedy generation over its two files, tokens/s beside PyTorch's generate().

Machines here are shared and noisy: compare figures from one run, not across runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import int8_before  # bench/, beside this script

ROOT = Path(__file__).resolve().parent.parent

BARE_EXPORT = r"""
# The same export as recipes/gpt2.yaml (with the KV cache), written by hand.
import sys, time, torch, transformers, yaml
from transformers import DynamicCache
recipe = yaml.safe_load(open(sys.argv[1]))
config = dict(recipe["source"]["huggingface"]["config"])
cfg = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
L, H, D = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head

class Wrapped(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(L)], config=self.m.config)
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

b, s, p = 2, 16, 4
past = [torch.randn(b, H, p, D) for _ in range(2 * L)]
args = (torch.randint(0, cfg.vocab_size, (b, s)), torch.ones(b, p + s, dtype=torch.long), torch.arange(p, p + s).expand(b, s), *past)
pasts = [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
presents = [f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"}, "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
axes.update({n: {0: "batch", 2: "past_sequence"} for n in pasts})
axes.update({n: {0: "batch", 2: "total_sequence"} for n in presents})
torch.onnx.export(Wrapped(model), args, sys.argv[2], dynamo=False, input_names=["input_ids", "attention_mask", "position_ids", *pasts],
                  output_names=["logits", *presents], dynamic_axes=axes, opset_version=18)
"""  # noqa: E501


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return took


def main() -> None:
    onnxbuild = shutil.which("onnxbuild") or sys.exit("onnxbuild is not installed (make install)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ONNXBUILD_CACHE_DIR", None)
    with tempfile.TemporaryDirectory(prefix="onnxbuild-bench-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "recipes", work / "recipes")

        run([onnxbuild, "make", "recipes/linear-regression.yaml"], work, env)
        run([onnxbuild, "make", "recipes/linear-regression.yaml"], work, env)  # warm the memo files
        noop = [run([onnxbuild, "make", "recipes/linear-regression.yaml"], work, env) for _ in range(7)]
        print(
            f"no-op make (linear-regression, all cached): median {statistics.median(noop):.3f} s, "
            f"min {min(noop):.3f} s over {len(noop)} runs (target < 0.3 s)"
        )

        bare = run([sys.executable, "-c", BARE_EXPORT, "recipes/gpt2.yaml", str(work / "bare.onnx")], work, env)
        via = run([onnxbuild, "make", "recipes/gpt2.yaml", "--target", "export"], work, env)
        print(
            f"GPT-2 export: bare torch.onnx.export script {bare:.1f} s, onnxbuild (source + export, cold) {via:.1f} s: "
            f"overhead {100 * (via / bare - 1):+.1f}% (target < 10%)"
        )

        shutil.rmtree(work / ".onnxbuild")
        shutil.rmtree(work / "artifacts")
        # The core path only (issue: source + export + check + validate in < 3 min, < 4 GB).
        steps: dict[str, dict] = {}
        cold = 0.0
        for target in ("check", "validate"):
            cold += run([onnxbuild, "make", "recipes/gpt2.yaml", "--target", target], work, env)
            for name, t in json.loads((work / "artifacts" / "gpt2" / "timings.json").read_text())["steps"].items():
                if t["status"] == "built":
                    steps[name] = t
        peak = max((t["peak_rss_mb"] or 0) for t in steps.values())
        per_step = ", ".join(f"{name} {t['seconds']:.1f} s / {t['peak_rss_mb']:.0f} MB" for name, t in steps.items())
        print(
            f"GPT-2 cold build of source, export, check, validate (-j 1): {cold:.1f} s wall (target < 180 s); "
            f"peak step RSS {peak / 1024:.2f} GB (target < 4 GB)"
        )
        print(f"  per step: {per_step}")
        validation = json.loads((work / "artifacts" / "gpt2" / "reports" / "validation" / "model.json").read_text())
        shapes = validation["variants"]["model"]["shapes"]
        worst = max(o["max_abs_diff"] for s in shapes for o in s["outputs"].values())
        print(
            f"  validation: passed={validation['passed']} at {len(shapes)} shapes, logits max abs diff "
            f"{worst:.2e}, weights {validation['weights']}"
        )
        model_sha = hashlib.sha256((work / "artifacts" / "gpt2" / "model.onnx").read_bytes()).hexdigest()
        print(f"  model.onnx sha256 {model_sha} (compare across directories and machines)")
        again = run([onnxbuild, "make", "recipes/gpt2.yaml", "--target", "validate"], work, env)
        print(f"GPT-2 no-op make (core path cached): {again:.3f} s")

        full = run([onnxbuild, "make", "recipes/gpt2.yaml"], work, env)
        timings = json.loads((work / "artifacts" / "gpt2" / "timings.json").read_text())["steps"]
        peak = max((t["peak_rss_mb"] or 0) for t in timings.values())
        print(
            "GPT-2 whole recipe after the core path (optimize, int8, int4, their validations, benchmark): "
            f"{full:.1f} s more; peak step RSS {peak / 1024:.2f} GB"
        )
        bench = json.loads((work / "artifacts" / "gpt2" / "benchmark.json").read_text())
        validation = json.loads((work / "artifacts" / "gpt2" / "reports" / "validation.json").read_text())
        print_benchmark(bench, validation)
        generation = json.loads((work / "artifacts" / "gpt2" / "reports" / "generation.json").read_text())
        same = [v for v, r in generation["variants"].items() if r["greedy"]["identical"]]
        print(
            f"  greedy generation of {generation['max_new_tokens']} tokens identical to PyTorch generate(): "
            f"{', '.join(same)}"
        )
        int8_before.main(work / "artifacts" / "gpt2")

        run([onnxbuild, "make", "recipes/all-minilm-l6-v2.yaml"], work, env)
        folder = work / "artifacts" / "all-minilm-l6-v2"
        bench = json.loads((folder / "benchmark.json").read_text())
        validation = json.loads((folder / "reports" / "validation.json").read_text())
        base = bench["baseline"][0]
        print(
            f"all-MiniLM-L6-v2 (real weights), seq {base['shape']['sequence']}: PyTorch eager "
            f"({base['attention']}) p50 {base['p50_ms']:.1f} ms"
        )
        for r in bench["results"]:
            cos = validation["variants"][r["variant"]].get("embedding_cosine") or {}
            extra = f", embedding cosine mean {cos['mean']:.4f} min {cos['min']:.4f}" if cos else ""
            print(f"    {r['variant']:<10} p50 {r['p50_ms']:7.1f} ms = {r['ratio_to_pytorch']:.2f}x PyTorch{extra}")
        print("  target: int8 mean cosine >= 0.99 at <= 0.35x PyTorch")

        run([onnxbuild, "make", "recipes/whisper-tiny.yaml"], work, env)
        print_seq2seq("whisper-tiny", json.loads((work / "artifacts" / "whisper-tiny" / "benchmark.json").read_text()))
        screenshots(work, onnxbuild, env)

    executors()


OUT = ROOT / "bench" / "out"


def print_benchmark(bench: dict, validation: dict) -> None:
    """GPT-2's benchmark.json as rows: PyTorch fp32 and bf16, every variant on every provider,
    each with its share of the machine's limit; then decode; the fastest validated per shape."""
    from onnxbuild.report.benchmark import fastest, limits_line, validated_on

    peaks = bench.get("peaks")
    if peaks:
        print(f"  machine limits ({bench['machine']['cpu']}, {peaks['threads']} threads): {limits_line(peaks)}")
    if (bench.get("pytorch_bf16") or {}).get("status") == "skipped":
        print(f"  PyTorch bf16 not timed: {bench['pytorch_bf16']['reason']}")

    def limit(row: dict) -> str:
        r = row.get("roofline")
        return f"{r['fraction']:.0%} of {r['limit']}" if r else "-"

    for b in bench["baseline"]:
        print(
            f"  seq {b['shape']['sequence']:>4}  PyTorch {b.get('dtype', 'fp32')} eager ({b['attention']}){'':<9} "
            f"p50 {b['p50_ms']:7.1f} ms  {limit(b)}"
        )
    for r in bench["results"]:
        if "p50_ms" not in r:
            print(f"  {r['variant']} on {r['provider']}: error: {r.get('error')}")
            continue
        where = r["provider"].replace("ExecutionProvider", "") + (
            f" {r['inference_precision']}" if r.get("inference_precision") else ""
        )
        checked = "validated" if validated_on(bench, r) else "not validated here"
        top1 = validation["variants"].get(r["variant"], {}).get("top1") or {}
        agree = f", top-1 {top1['agreement']:.3f}" if top1 and r["provider"] == "CPUExecutionProvider" else ""
        ratios = ", ".join(
            f"{x:.2f}x PyTorch {t}"
            for x, t in ((r.get("ratio_to_pytorch"), "fp32"), (r.get("ratio_to_pytorch_bf16"), "bf16"))
            if x
        )
        print(
            f"  seq {r['shape']['sequence']:>4}  {r['variant']:<9} on {where:<13} p50 {r['p50_ms']:7.1f} ms = "
            f"{ratios}; {limit(r)} ({checked}{agree})"
        )
    for d in bench.get("decode", []):
        who = (
            f"PyTorch {d.get('dtype', 'fp32')}"
            if d["engine"] == "pytorch"
            else f"{d['variant']} on {d['provider'].replace('ExecutionProvider', '')}"
        )
        ratio = (
            f" = {d['decode_ratio_to_pytorch']:.2f}x PyTorch fp32"
            if d["engine"] != "pytorch" and d.get("decode_ratio_to_pytorch")
            else ""
        )
        print(
            f"  decode after {d['shape']['sequence']:>4}: {who:<22} prefill {d['prefill_p50_ms']:7.1f} ms, per "
            f"token {d['decode_p50_ms']:6.2f} ms{ratio}, "
            f"{d['tokens_per_s']:.1f} tokens/s; {limit(d)}"
        )
    for line in fastest(bench):  # benchmark.md's lead, as printed there
        if line:
            print(f"  {line.replace('**', '')}")
    print(
        "  target (seq 128, a CPU with native bf16): fastest validated <= 0.5x PyTorch bf16; its decode step no "
        "slower than int8's (today's above; the int8 of before issue 21 below)"
    )


def print_seq2seq(name: str, bench: dict) -> None:
    """An encoder-decoder's generation beside PyTorch's generate(): tokens/s of a whole greedy
    generation (the encoder once, then the decoder steps), the first token and one decoder step."""
    rows = bench.get("decode", [])
    torch_row = next((d for d in rows if d["engine"] == "pytorch"), None)
    for d in rows:
        who = "PyTorch generate()" if d["engine"] == "pytorch" else f"{d['variant']} (ORT loop)"
        than = (
            f" = {d['tokens_per_s'] / torch_row['tokens_per_s']:.2f}x PyTorch's tokens/s"
            if torch_row and d is not torch_row
            else ""
        )
        print(
            f"{name} batch {d['shape'].get('batch', 1)}, {d['new_tokens']} tokens: {who:<22} "
            f"{d['tokens_per_s']:6.1f} tokens/s{than}; first token {d['prefill_p50_ms']:.1f} ms, "
            f"decoder step {d['decode_p50_ms']:.2f} ms"
        )
    print(f"  target: every fp32 variant's tokens/s >= PyTorch generate()'s ({name}, random-init weights)")


def screenshots(work: Path, onnxbuild: str, env: dict[str, str]) -> None:
    """Build every shipped recipe and keep a screenshot of its report.html in bench/out/
    (git-ignored), so a reader can look at each page without building."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("report screenshots: chromium is not installed (make install installs it); skipped")
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for recipe in sorted((work / "recipes").glob("*.yaml")):
        done = subprocess.run(
            [onnxbuild, "make", str(recipe.relative_to(work))], cwd=work, env=env, capture_output=True, text=True
        )
        name = next(
            (
                line.split(":", 1)[1].strip()
                for line in recipe.read_text(encoding="utf-8").splitlines()
                if line.startswith("name:")
            ),
            recipe.stem,
        )
        page = work / "artifacts" / name / "report.html"
        if not page.is_file():
            print(f"  report of {recipe.name}: not written (make exited {done.returncode})")
            continue
        shot = OUT / f"report-{name}.png"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--screenshot={shot}",
                "--window-size=1280,2400",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=120,
        )
        shutil.copy(page, OUT / f"report-{name}.html")
        print(f"  report of {recipe.name}: {shot.relative_to(ROOT)} (and .html)")


SMALL = ["linear-regression.yaml", "tiny-gpt2.yaml", "digits-mlp.yaml"]


def executors() -> None:
    """Wall time of building the small recipes from a cold cache with each executor."""
    onnxbuild = shutil.which("onnxbuild") or sys.exit("onnxbuild is not installed (make install)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ONNXBUILD_CACHE_DIR", None)
    try:
        import ray  # noqa: F401
    except ImportError:
        print("executors: ray is not installed (pip install 'onnxbuild[ray]'); skipped")
        return
    figures = []
    for label, extra in (
        ("local -j 1", ["-j", "1"]),
        ("local -j 2", ["-j", "2"]),
        ("ray (local instance, 2 CPUs)", ["--executor", "ray"]),
    ):
        with tempfile.TemporaryDirectory(prefix="onnxbuild-bench-") as tmp:
            work = Path(tmp)
            (work / "recipes").mkdir()
            for name in [*SMALL, "digits_mlp.py"]:
                shutil.copy(ROOT / "recipes" / name, work / "recipes" / name)
            took = run([onnxbuild, "make", *(f"recipes/{n}" for n in SMALL), *extra], work, env)
            figures.append(f"{label} {took:.1f} s")
    print(
        f"{len(SMALL)} small recipes from a cold cache: " + "; ".join(figures) + " (ray includes starting the instance)"
    )


if __name__ == "__main__":
    main()
