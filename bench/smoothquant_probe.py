"""Issue 52's first measurement: can 8-bit activations keep SmolLM2's quality? (Not in `make bench`.)

A probe, not a quantize method yet: it measures what a method would do, so that the method is
built on figures. On SmolLM2-135M's fused graph (recipes/smollm2-135m.yaml's `optimized`):

1. per-channel |max| of every MatMul's input over recipes/text/calibration.txt (windows of 256);
2. SmoothQuant: each activation divided by s, the weights it feeds multiplied by s,
   s = amax^a / wmax^(1-a), with a per group (the MatMuls one activation feeds) chosen from
   ALPHAS to minimise the group's simulated error (per-tensor dynamic uint8 activations, as
   onnxruntime's DynamicQuantizeLinear, per-column int8 weights) on the calibration rows. The
   1/s goes into what makes the activation: the norm's weight (q/k/v, gate/up, lm_head),
   up_proj's columns (down_proj: its input is silu(gate) * up), v's columns (o_proj: one s per
   key-value head and dim, shared by its query heads);
3. onnxruntime's quantize_dynamic (per-channel int8 weights) on the smoothed graph, the MatMuls
   named by KEEP left out of it, then those at 8-bit weight-only (MatMulNBits, accuracy_level 4);
4. perplexity increase, mean KL and top-1 against the fp32 file on recipes/text/eval.txt (never
   seen by the calibration), and the 128-token prefill, p50, 2 threads.

    python bench/smoothquant_probe.py [KEEP [N]]   # KEEP: name parts, default down_proj,lm_head;
                                                   # N: also the N groups of largest simulated error

Builds the smollm2 recipe's `optimized` first (`onnxbuild make -t optimize`).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "smoothquant"
ALPHAS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30  # SmolLM2-135M
NORMS = {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 2, "RMSNormalization": 1}
"""Norm op -> the input holding its weight."""


def feeds(ids: np.ndarray) -> dict[str, np.ndarray]:
    f = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None]}
    for i in range(LAYERS):
        for kv in ("key", "value"):
            f[f"past_key_values.{i}.{kv}"] = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
    return f


def session(model: Any) -> Any:
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def windows(tokenizer: Any, path: Path, n: int = 256) -> list[np.ndarray]:
    ids = tokenizer.encode(path.read_text(encoding="utf-8")).ids
    return [np.array(ids[i : i + n], dtype=np.int64)[None] for i in range(0, len(ids) - n + 1, n)]


def q_act(x: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear: uint8, asymmetric, one scale for the tensor."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255 or 1.0
    zero = np.clip(np.round(-lo / scale), 0, 255)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def q_weight(w: np.ndarray) -> np.ndarray:
    """Symmetric int8, one scale per output column."""
    s = np.abs(w).max(0, keepdims=True) / 127
    s[s == 0] = 1
    return np.round(w / s) * s


def smoothed(model: Any, calibration: list[np.ndarray]) -> tuple[Any, dict[str, float], dict[str, float]]:
    """``model`` with SmoothQuant folded in, each group's alpha and its simulated relative error
    at that alpha (by the group's first MatMul's name)."""
    import onnx
    from onnx import numpy_helper

    weights = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    groups: dict[str, list[Any]] = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in weights:
            groups.setdefault(n.input[0], []).append(n)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(a, onnx.TensorProto.FLOAT, None) for a in groups)
    runs = session(probe)
    names = list(groups)
    amax: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {a: [] for a in names}
    for ids in calibration:
        for a, x in zip(names, runs.run(names, feeds(ids)), strict=True):
            x = x.reshape(-1, x.shape[-1])
            amax[a] = np.maximum(amax.get(a, 0), np.abs(x).max(0))
            rows[a].append(x[:128])  # one prefill call's worth: its per-tensor scale covers it
    del runs
    alphas: dict[str, float] = {}
    errors: dict[str, float] = {}
    group = HEADS // KV_HEADS
    for a, mms in groups.items():
        ws = [weights[n.input[1]] for n in mms]
        am = np.maximum(amax[a], 1e-5)
        wm = np.maximum(np.max([np.abs(w).max(1) for w in ws], 0), 1e-5)
        if "o_proj" in mms[0].name:  # one s per key-value head and dim: v's columns carry it
            am = np.repeat(am.reshape(KV_HEADS, group, HEAD_DIM).max(1), group, axis=0).reshape(-1)
            wm = np.repeat(wm.reshape(KV_HEADS, group, HEAD_DIM).max(1), group, axis=0).reshape(-1)
        best: tuple[float, float, np.ndarray] | None = None
        for alpha in ALPHAS:
            s = am**alpha / wm ** (1 - alpha) if alpha else np.ones_like(am)
            s = s / np.sqrt(s.max() * s.min())
            quantized = [q_weight(w * s[:, None]) for w in ws]
            err = sum(
                float(np.square(q_act(x / s) @ qw - x @ w).sum()) for x in rows[a] for w, qw in zip(ws, quantized)
            )
            if best is None or err < best[0]:
                best = (err, alpha, s)
        assert best is not None
        err, alphas[mms[0].name], s = best
        errors[mms[0].name] = err / sum(float(np.square(x @ w).sum()) for x in rows[a] for w in ws)
        s = s.astype(np.float32)
        for n in mms:
            weights[n.input[1]] *= s[:, None]
        made = producer[a]
        layer = mms[0].name.split("/")[2]
        if made.op_type in NORMS:
            weights[made.input[NORMS[made.op_type]]] /= s
        elif "down_proj" in mms[0].name:
            weights[f"model.{layer}.mlp.up_proj.weight"] /= s[None, :]
        elif "o_proj" in mms[0].name:
            v = s.reshape(KV_HEADS, group, HEAD_DIM)[:, 0, :].reshape(-1)
            weights[f"model.{layer}.attn.qkv_proj.weight"][:, (HEADS + KV_HEADS) * HEAD_DIM :] /= v[None, :]
        else:
            sys.exit(f"no place to fold 1/s for {a} (made by {made.op_type})")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(weights[t.name], t.name))
    return out, alphas, errors


def quality(candidate: Any, reference: Any, texts: list[np.ndarray]) -> tuple[float, float, float]:
    """(perplexity increase, mean KL from the reference, top-1 agreement) over ``texts``."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    nll = nll_ref = kl = 0.0
    same = count = 0
    for ids in texts:
        got = log_softmax(candidate.run(["logits"], feeds(ids))[0][0, :-1].astype(np.float64))
        ref = log_softmax(reference.run(["logits"], feeds(ids))[0][0, :-1].astype(np.float64))
        target = ids[0, 1:]
        nll -= got[np.arange(len(target)), target].sum()
        nll_ref -= ref[np.arange(len(target)), target].sum()
        kl += float((np.exp(ref) * (ref - got)).sum())
        same += int((got.argmax(-1) == ref.argmax(-1)).sum())
        count += len(target)
    return math.exp(nll / count) / math.exp(nll_ref / count) - 1, kl / count, same / count


def prefill_ms(runs: Any, n: int = 128, reps: int = 10) -> float:
    f = feeds(np.arange(100, 100 + n, dtype=np.int64)[None])
    for _ in range(3):
        runs.run(["logits"], f)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        runs.run(["logits"], f)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[reps // 2]


def main() -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from tokenizers import Tokenizer

    keep = (sys.argv[1] if len(sys.argv) > 1 else "down_proj,lm_head").split(",")
    worst = int(sys.argv[2]) if len(sys.argv) > 2 else 0  # and the N groups with the largest simulated error
    subprocess.run(
        [sys.executable, "-m", "onnxbuild", "make", "recipes/smollm2-135m.yaml", "-t", "optimize"], cwd=ROOT, check=True
    )
    art = ROOT / "artifacts" / "smollm2-135m"
    src = art / "optimized" / "model.onnx"
    tokenizer = Tokenizer.from_file(str(art / "tokenizer.json"))
    calibration = windows(tokenizer, ROOT / "recipes" / "text" / "calibration.txt")
    held_out = windows(tokenizer, ROOT / "recipes" / "text" / "eval.txt")
    OUT.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src))
    smooth, alphas, errors = smoothed(model, calibration)
    onnx.save(smooth, str(OUT / "smooth.onnx"))
    print("alpha per group:", ", ".join(f"{a:g}" for a in alphas.values()))
    left = [n.name for n in model.graph.node if n.op_type == "Attention"]
    kept = [n.name for n in model.graph.node if n.op_type == "MatMul" and any(k in n.name for k in keep)]
    ranked = [k for k in sorted(errors, key=errors.__getitem__, reverse=True) if k not in kept][:worst]
    by_input = {n.name: n.input[0] for n in model.graph.node}
    kept += [
        n.name for n in model.graph.node if n.op_type == "MatMul" and any(by_input[r] == n.input[0] for r in ranked)
    ]
    if worst:
        print("also kept:", ", ".join(ranked))
    shown = "/".join(keep) + (f" and the {worst} worst" if worst else "")
    files = {}
    for name, source in (("dynamic int8", src), ("smoothed dynamic int8", OUT / "smooth.onnx")):
        out = OUT / f"{name.replace(' ', '-')}.onnx"
        quantize_dynamic(
            str(source),
            str(out),
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=left + kept,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        files[f"{name}, {shown} fp32"] = out
    smooth_int8 = onnx.load(str(files[f"smoothed dynamic int8, {shown} fp32"]))
    mixed = MatMulNBitsQuantizer(
        smooth_int8, bits=8, block_size=32, is_symmetric=False, accuracy_level=4, nodes_to_include=kept
    )
    mixed.process()
    onnx.save(mixed.model.model, str(OUT / "mixed.onnx"))
    files[f"smoothed dynamic int8, {shown} 8-bit weight-only"] = OUT / "mixed.onnx"
    reference = session(src)
    print("| file | ppl | KL | top-1 | prefill 128 |\n|---|---|---|---|---|")
    print(f"| fp32 | - | - | - | {prefill_ms(reference):.0f} ms |")
    for name, path in files.items():
        runs = session(path)
        ppl, kl, top1 = quality(runs, reference, held_out)
        print(f"| {name} | {ppl:+.2%} | {kl:.4f} | {top1:.3f} | {prefill_ms(runs):.0f} ms |")


if __name__ == "__main__":
    main()
