"""Decoders beside onnxruntime-genai's model builder, in one run (`make bench` calls this).

For each recipe (default: recipes/llama-125m.yaml, recipes/qwen2-125m.yaml and recipes/mistral-125m.yaml, a sliding window of 64): build it with
onnxbuild, save the same seeded weights as a Hugging Face folder, build that folder with the
model builder (fp32, int4 at its default block 32 and at block 128; CPU) in a separate virtual environment (onnxruntime-genai
ships its own onnxruntime), then time every file with this environment's onnxruntime, one
file per process, alternating, best of three rounds:

  prefill: 128 tokens with an empty past;  decode: one token after a past of 128, and after
  a past of 1024 (where a sliding window's layers read fewer keys than a full layer);
  each with ONNX Runtime's defaults and with denormals flushed to zero
  (session.set_denormal_as_zero, which onnxbuild's benchmark, validate and `onnxbuild run`
  set; onnxruntime-genai's config has no key for it). Both files of a pair get the same setting.

    python bench/decoders.py [RECIPE ...]      # GENAI_PYTHON=/path/to/venv/bin/python to reuse a venv,
                                               # BENCH_ROUNDS=5 for more alternating rounds

Figures depend on the machine: compare rows of one run only.
"""  # noqa: E501

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "decoders"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))

TIME_ONE = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
path, layers, kv, head_dim, vocab = sys.argv[1], *map(int, sys.argv[2:6])
LONG = 1024
def time_both(s):
    names = {i.name: i for i in s.get_inputs()}
    dtype = np.float16 if "float16" in names["past_key_values.0.key"].type else np.float32
    def feeds(ids, past_len, past):
        f = {"input_ids": ids, "attention_mask": np.ones((1, past_len + ids.shape[1]), np.int64)}
        if "position_ids" in names:
            f["position_ids"] = np.arange(past_len, past_len + ids.shape[1], dtype=np.int64)[None]
        f.update(past)
        return {k: (v.astype(np.int32) if "int32" in names[k].type else v) for k, v in f.items() if k in names}
    empty = {f"past_key_values.{i}.{k}": np.zeros((1, kv, 0, head_dim), dtype) for i in range(layers) for k in ("key", "value")}
    ids = np.random.default_rng(0).integers(0, vocab, (1, 128))
    outs = [o.name for o in s.get_outputs()]
    def prefill():
        return s.run(None, feeds(ids, 0, empty))
    res = prefill()
    past = {n.replace("present", "past_key_values"): r for n, r in zip(outs, res) if n.startswith("present")}
    step = np.array([[7]])
    def decode():
        s.run(None, feeds(step, 128, past))
    # a long past (random values: the time does not depend on them), where a sliding window's
    # layers read a window of keys and a full layer the whole past
    long_past = {k: np.random.default_rng(2).standard_normal((1, kv, LONG, head_dim)).astype(dtype) for k in empty}
    def decode_long():
        s.run(None, feeds(step, LONG, long_past))
    def p50(fn, n):
        for _ in range(2): fn()
        t = []
        for _ in range(n):
            a = time.perf_counter(); fn(); t.append((time.perf_counter() - a) * 1000)
        return sorted(t)[len(t) // 2]
    return {"prefill_ms": p50(prefill, 8), "decode_ms": p50(decode, 30), "decode_long_ms": p50(decode_long, 30)}
def session(flush):
    options = ort.SessionOptions(); options.log_severity_level = 3
    if flush:
        options.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
out = {}
for flush in (False, True):
    s = session(flush)
    out.update({f"{k}_daz" if flush else k: v for k, v in time_both(s).items()})
    del s
print(json.dumps(out))
"""  # noqa: E501

SAVE_HF = r"""
import json, sys
from pathlib import Path
from onnxbuild import load_recipe
from onnxbuild.sources.huggingface import load_model
recipe = load_recipe(sys.argv[1])
record = json.loads((Path(sys.argv[2]) / "reports" / "source.json").read_text())
model = load_model(recipe.source, record, recipe.directory)
model.save_pretrained(sys.argv[3])
# the builder saves a tokenizer beside its model: a small one trained here (the Hub is not reachable)
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator(["the onnx format holds a graph of operators and their weights"] * 20, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(sys.argv[3])
print(json.dumps({"layers": model.config.num_hidden_layers, "kv": model.config.num_key_value_heads,
                  "head_dim": getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads,
                  "vocab": model.config.vocab_size}))
"""  # noqa: E501


def genai_python() -> str | None:
    """A Python with onnxruntime-genai: $GENAI_PYTHON, or a venv made once under bench/out."""
    if os.environ.get("GENAI_PYTHON"):
        return os.environ["GENAI_PYTHON"]
    venv = OUT / "genai-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"  making {venv} (onnxruntime-genai, with this environment's torch and transformers)")
        done = subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True
        )
        if done.returncode == 0:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "onnxruntime-genai"], capture_output=True, text=True
            )
        if done.returncode != 0:
            print(
                f"  onnxruntime-genai could not be installed ({done.stderr.strip()[-300:]}); the builder's rows "
                "are skipped"
            )
            return None
    return str(python)


def main(recipes: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    work = OUT / "project"
    (work / "recipes").mkdir(parents=True, exist_ok=True)
    genai = genai_python()
    for recipe in recipes:
        src = ROOT / recipe
        (work / "recipes" / src.name).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
        built = subprocess.run(
            [sys.executable, "-m", "onnxbuild", "make", f"recipes/{src.name}", "-j", "2"],
            cwd=work,
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            print(f"{recipe}: onnxbuild make failed:\n{built.stderr[-2000:]}")
            continue
        name = next(
            line.split(":", 1)[1].strip()
            for line in src.read_text(encoding="utf-8").splitlines()
            if line.startswith("name:")
        )
        artifacts = work / "artifacts" / name
        hf = OUT / name / "hf"
        dims = json.loads(
            subprocess.run(
                [sys.executable, "-c", SAVE_HF, str(work / "recipes" / src.name), str(artifacts), str(hf)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        files = {f"onnxbuild {v}": artifacts / v / "model.onnx" for v in ("optimized", "int8", "int4")}
        files = {"onnxbuild model": artifacts / "model.onnx", **files}
        if genai:
            # its defaults (int4: block 32), and int4 at block 128 as our recipes quantize, so
            # the 4-bit rows compare like with like as well as against what a user gets
            for label, precision, extra in (
                ("fp32", "fp32", []),
                ("int4", "int4", []),
                ("int4 b128", "int4", ["--extra_options", "block_size=128"]),
            ):
                out = OUT / name / f"builder-{label.replace(' ', '-')}"
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
                        precision,
                        "-e",
                        "cpu",
                        "-c",
                        str(OUT / "cache"),
                        *extra,
                    ],
                    capture_output=True,
                    text=True,
                )
                if done.returncode == 0:
                    files[f"model builder {label}"] = out / "model.onnx"
                else:
                    print(f"  model builder {label} failed: {done.stderr.strip()[-500:]}")
        best: dict[str, dict[str, float]] = {}
        for _ in range(ROUNDS):  # alternate, so a noisy minute hits every row
            for label, path in files.items():
                done = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        TIME_ONE,
                        str(path),
                        str(dims["layers"]),
                        str(dims["kv"]),
                        str(dims["head_dim"]),
                        str(dims["vocab"]),
                    ],
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    print(f"  {label}: could not be timed: {done.stderr.strip()[-300:]}")
                    continue
                t = json.loads(done.stdout)
                b = best.setdefault(label, t)
                best[label] = {k: min(b[k], t[k]) for k in t}
        print(f"{name} (batch 1; best of {ROUNDS} rounds of p50; one process per file):")
        print(f"  {'':<24} {'denormals as they come':>31}   {'denormals flushed (onnxbuild run)':>33}")
        print(
            f"  {'file':<24} {'prefill 128':>12} {'decode after 128':>17} {'after 1024':>11}   {'prefill 128':>14} "
            f"{'decode after 128':>17} {'after 1024':>11}"
        )
        for label, t in best.items():
            print(
                f"  {label:<24} {t['prefill_ms']:>9.1f} ms {t['decode_ms']:>14.2f} ms {t['decode_long_ms']:>8.2f} ms   "
                f"{t['prefill_ms_daz']:>11.1f} ms {t['decode_ms_daz']:>14.2f} ms {t['decode_long_ms_daz']:>8.2f} ms"
            )
        for line in verdicts(best):
            print(f"  {line}")
        fused = json.loads((artifacts / "reports" / "optimize.json").read_text(encoding="utf-8"))["fused_ops"]
        print(f"  onnxbuild optimized fused ops: {fused}")
        from onnxbuild.environment import cpu_info

        (OUT / f"{name}.json").write_text(json.dumps(best, indent=2), encoding="utf-8")
        # committed: docs/gen.py renders bench/results/*.json into the site's figures page
        (ROOT / "bench" / "results" / f"decoders-{name}.json").write_text(
            json.dumps({"cpu": cpu_info()[0], **best}, indent=2), encoding="utf-8"
        )
        if genai:
            genai_loads(genai, artifacts)


def verdicts(best: dict[str, dict[str, float]]) -> list[str]:
    """The issue's comparisons, ours against the builder's at the same precision, in both
    settings: our best fp32 file against its fp32, our int4 against its default int4 (and its
    block-128 one, like with like)."""
    pairs = [
        ("fp32", ["onnxbuild model", "onnxbuild optimized"], "model builder fp32"),
        ("int4", ["onnxbuild int4"], "model builder int4"),
        ("int4 vs block 128", ["onnxbuild int4"], "model builder int4 b128"),
    ]
    out = []
    for what, ours, theirs in pairs:
        if theirs not in best or not any(o in best for o in ours):
            continue
        cells = []
        for key, label in (
            ("prefill_ms", "prefill"),
            ("decode_ms", "decode"),
            ("decode_long_ms", "decode after 1024"),
            ("prefill_ms_daz", "prefill flushed"),
            ("decode_ms_daz", "decode flushed"),
            ("decode_long_ms_daz", "decode after 1024 flushed"),
        ):
            mine = min(best[o][key] for o in ours if o in best)
            gap = 100 * (mine / best[theirs][key] - 1)
            cells.append(f"{label} {'ok' if gap <= 0 else 'SLOWER'} ({gap:+.1f}%)")
        out.append(f"ours vs builder, {what}: " + ", ".join(cells))
    return out


def genai_loads(genai: str, artifacts: Path) -> None:
    """onnxruntime-genai loads each variant folder and generates what onnxbuild's generate step did."""
    gen = json.loads((artifacts / "reports" / "generation.json").read_text(encoding="utf-8"))
    prompt = [str(t) for t in gen["prompt_ids"]]
    for variant in ("model", "optimized", "int4"):
        folder = artifacts if variant == "model" else artifacts / variant
        done = subprocess.run(
            [genai, str(ROOT / "bench" / "genai_check.py"), str(folder), *prompt], capture_output=True, text=True
        )
        if done.returncode != 0:
            print(
                f"  onnxruntime-genai could not generate from {folder.relative_to(artifacts.parent)}: "
                f"{done.stderr.strip()[-300:]}"
            )
            continue
        tokens = [int(t) for t in done.stdout.split()]
        ours = gen["variants"][variant]["greedy"]["tokens"][: len(tokens)]
        same = "the same greedy tokens as" if tokens == ours else "DIFFERENT tokens from"
        print(
            f"  onnxruntime-genai on {folder.relative_to(artifacts.parent)}/: {len(tokens)} tokens, {same} "
            "onnxbuild's generate step"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["recipes/llama-125m.yaml", "recipes/qwen2-125m.yaml", "recipes/mistral-125m.yaml"])
