"""GPT-2's fastest validated prefill file against "today's int8" of issue 21, in one process.

Issue 21 asked that GPT-2's fastest validated artifact at a 128-token prefill decode no slower
than "today's int8": the `int8` file as the code built it when the issue was filed. That code
is commit BEFORE, the last one before the issue's work began (its fused GPT-2 graph used
GroupQueryAttention; the ONNX Attention graph that made today's `int8` decode faster landed
during the issue). This script builds that file with that code (`git archive`, its own cache
and artifacts in a temporary folder; nothing in this checkout is touched), then times, in one
process and interleaved (this machine is shared and noisy, so only ratios from one run mean
anything):

- the fastest validated (variant, provider) at batch 1, sequence 128, read from benchmark.json,
  at prefill and at one decode step after a past of 128 (a model that holds its cache: 8
  successive steps after it, the past set back untimed, as the benchmark step does);
- the `int8` file as built before the issue, on the CPU provider, with ONNX Runtime's defaults
  (how its code ran it) and with denormals flushed (how every session runs an artifact today);
- today's `int8` on the CPU provider.

    python bench/int8_before.py [ARTIFACT_DIR]     (default artifacts/gpt2; bench/run.py calls it)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "7ea90b7189038a094c00b1d1a45152f784cd6f17"
PAST = 128
PASTS = (32, 128)  # the benchmark step's decode rows
ROUNDS = 12
SPAN = 8  # the benchmark step's STATEFUL_SPAN


def build_before(tmp: Path) -> Path | str:
    """The `int8` file as the code of BEFORE built it from its own recipes/gpt2.yaml (int4,
    generate and benchmark left out: they do not touch `int8`). A path, or why not."""
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot read commit {BEFORE[:7]} from this checkout's history ({exc}); a full clone has it"
    src = tmp / "before"
    src.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(tar)
        f.seek(0)
        with tarfile.open(fileobj=f) as archive:
            archive.extractall(src, filter="data")
    import yaml

    recipe = yaml.safe_load((src / "recipes" / "gpt2.yaml").read_text(encoding="utf-8"))
    recipe["quantize"] = [q for q in recipe["quantize"] if q["name"] == "int8"]
    for key in ("generate", "benchmark"):
        recipe.pop(key, None)
    (src / "recipes" / "gpt2-int8.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src), "ONNXBUILD_CACHE_DIR": str(src / ".cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "onnxbuild", "make", "recipes/gpt2-int8.yaml"], cwd=src, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return f"the code of {BEFORE[:7]} did not build it (exit {done.returncode}): {(done.stdout + done.stderr)[-600:]}"
    return src / "artifacts" / "gpt2" / "int8" / "model.onnx"


def fastest_at(bench: dict[str, Any], sequence: int) -> dict[str, Any] | None:
    from onnxbuild.report.benchmark import validated_on

    rows = [r for r in bench["results"] if "p50_ms" in r and not r.get("io_binding") and r["shape"] == {"batch": 1, "sequence": sequence} and validated_on(bench, r)]
    return min(rows, key=lambda r: r["p50_ms"], default=None)


def feeds(names: list[str], past: int, tokens: int, config: dict[str, Any]) -> dict[str, Any]:
    """Seeded inputs of one call: ``tokens`` new tokens after a past of ``past``."""
    import numpy as np

    rng = np.random.default_rng(21)
    out: dict[str, Any] = {
        "input_ids": rng.integers(0, config["vocab_size"], size=(1, tokens), dtype=np.int64),
        "attention_mask": np.ones((1, past + tokens), dtype=np.int64),
        "position_ids": np.arange(past, past + tokens, dtype=np.int64)[None],
    }
    for name in names:
        if name.startswith("past_key_values."):
            out[name] = rng.standard_normal((1, config["n_head"], past, config["n_embd"] // config["n_head"])).astype(np.float32)
    return {k: v for k, v in out.items() if k in names}


def p50(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def main(artifacts: Path) -> None:
    import onnxruntime as ort

    from onnxbuild import openvino_target, sessions

    bench = json.loads((artifacts / "benchmark.json").read_text())
    best = fastest_at(bench, PAST)
    if best is None:
        print(f"issue 21's decode line: skipped, no validated row at batch 1, sequence {PAST} in {artifacts / 'benchmark.json'}")
        return
    with tempfile.TemporaryDirectory(prefix="onnxbuild-int8-before-") as tmp:
        before = build_before(Path(tmp))
        if isinstance(before, str):
            print(f"issue 21's decode line: skipped, {before}")
            return
        path = artifacts / ("model.onnx" if best["variant"] == "model" else f"{best['variant']}/model.onnx")
        now_int8 = artifacts / "int8" / "model.onnx"
        flushed, plain = sessions.options(), ort.SessionOptions()
        cpu = ["CPUExecutionProvider"]
        ort_sessions = {
            f"int8 before the issue ({BEFORE[:7]}) on CPU, ORT defaults": ort.InferenceSession(str(before), plain, providers=cpu),
            f"int8 before the issue ({BEFORE[:7]}) on CPU, denormals flushed": ort.InferenceSession(str(before), flushed, providers=cpu),
            "int8 today on CPU": ort.InferenceSession(str(now_int8), flushed, providers=cpu),
        }
        label = f"{best['variant']} on {best['provider'].replace('ExecutionProvider', '')} (fastest validated at {PAST})"
        if best["provider"] == "openvino":
            session: Any = openvino_target.load(path, precision="auto")
        else:
            session = ort.InferenceSession(str(path), flushed, providers=[best["provider"]])
        names = [p.name for p in session.get_inputs()]
        config = json.loads((artifacts / "config.json").read_text())

        def block(fn: Callable[[], None], prepare: Callable[[], None] | None, n: int) -> list[float]:
            out = []
            for i in range(n):
                if prepare is not None and i % SPAN == 0:
                    prepare()
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1000)
            return out

        held = bool(getattr(session, "keeps_past", False))
        # label -> phase -> (call, untimed prepare): a prefill of PAST tokens, one decode step after each past
        calls: dict[str, dict[str, tuple[Callable[[], None], Callable[[], None] | None]]] = {}
        first = feeds(names, 0, PAST, config)
        calls[label] = {"prefill": ((lambda: session.infer(first)) if best["provider"] == "openvino" else (lambda: session.run(None, first)), None)}
        for past in PASTS:
            step_feeds = feeds(names, past, 1, config)
            if held:
                prepare, step = session.decode_steps(step_feeds, SPAN)
                calls[label][f"decode {past}"] = (step, prepare)
            else:
                calls[label][f"decode {past}"] = (lambda f=step_feeds: session.run(None, f), None)
        for key, s in ort_sessions.items():
            inputs = [i.name for i in s.get_inputs()]
            calls[key] = {}
            for phase, past, tokens in (("prefill", 0, PAST), *((f"decode {p}", p, 1) for p in PASTS)):
                f = feeds(inputs, past, tokens, config)
                calls[key][phase] = (lambda s=s, f=f: s.run(None, f), None)
        times: dict[str, dict[str, list[float]]] = {key: {phase: [] for phase in phases} for key, phases in calls.items()}
        for r in range(ROUNDS + 1):  # round 0 warms up
            for key, phases in calls.items():
                for phase, (fn, prepare) in phases.items():
                    got = block(fn, prepare, 3 if phase == "prefill" else 6 * SPAN)
                    times[key][phase] += got if r else []
    print(f"issue 21's decode line, in one process ({ROUNDS} interleaved rounds; batch 1; p50 of a prefill of {PAST} tokens and of one decode step after a past of "
          f"{' and '.join(map(str, PASTS))}{f', for a model that holds its cache {SPAN} successive steps from there' if held else ''}):")
    then = {phase: min(p50(times[k][phase]) for k in ort_sessions if "before" in k) for phase in calls[label]}
    for key, phases in times.items():
        figures = ", ".join(f"{phase} {p50(t):.2f} ms ({p50(t) / then[phase]:.2f}x)" for phase, t in phases.items())
        print(f"  {key:<62} {figures}")
    print("  (x: against the faster of the two runs of the int8 before the issue)")
    for past in PASTS:
        ours, old = p50(times[label][f"decode {past}"]), then[f"decode {past}"]
        now = p50(times["int8 today on CPU"][f"decode {past}"])
        print(f"  target: the fastest validated file's decode step after {past} no slower than the int8 before the issue's: "
              f"{'holds' if ours <= old else 'fails'} ({ours:.2f} against {old:.2f} ms, {ours / old:.2f}x; against today's int8 {now:.2f} ms, {ours / now:.2f}x)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "artifacts" / "gpt2")
