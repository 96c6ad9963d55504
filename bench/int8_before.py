"""GPT-2's fastest validated prefill file against "today's int8" of issue 21, in one process.

Issue 21 asked that GPT-2's fastest validated artifact at a 128-token prefill decode no slower
than "today's int8": the `int8` file as the code built it when the issue was filed (the same
sentence's "today the best is int8 at about 0.67x bf16", and its table's 39 ms prefill, are that
file's; today's `int8` prefills in about 30). The target is the decode step after that prefill;
the step after a 32-token prompt is printed beside it, since chat-style use starts there. That code
is commit BEFORE, the last one before the issue's work began (its fused GPT-2 graph used
GroupQueryAttention; the ONNX Attention graph that made today's `int8` decode faster landed
during the issue). This script builds that file with that code (`git archive`, its own cache
and artifacts in a temporary folder; nothing in this checkout is touched), then times, in one
process and interleaved (this machine is shared and noisy, so only ratios from one run mean
anything):

- the fastest validated (variant, provider) at batch 1, sequence 128, read from benchmark.json,
  at prefill and at one decode step after a past of 32 and of 128 (a model that holds its cache: 8
  successive steps after it, the past set back untimed, as the benchmark step does);
- the `int8` file as built before the issue, on the CPU provider, with ONNX Runtime's defaults
  (how its code ran it) and with denormals flushed (how every session runs an artifact today);
- today's `int8` on the CPU provider.

    python bench/int8_before.py [ARTIFACT_DIR]     (default artifacts/gpt2; bench/run.py calls it)
"""

from __future__ import annotations

import io
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
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(src, filter="data")
    import yaml

    recipe = yaml.safe_load((src / "recipes" / "gpt2.yaml").read_text(encoding="utf-8"))
    recipe["quantize"] = [q for q in recipe["quantize"] if q["name"] == "int8"]
    for key in ("generate", "benchmark"):
        recipe.pop(key, None)
    (src / "recipes" / "gpt2-int8.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src), "ONNXBUILD_CACHE_DIR": str(src / ".cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "onnxbuild", "make", "recipes/gpt2-int8.yaml"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return (
            f"the code of {BEFORE[:7]} did not build it (exit {done.returncode}): {(done.stdout + done.stderr)[-600:]}"
        )
    return src / "artifacts" / "gpt2" / "int8" / "model.onnx"


def feeds(session: Any, past: int) -> dict[str, Any]:
    """The benchmark step's own inputs: one new token after a seeded past of ``past`` tokens,
    or (``past`` 0) its prompt of PAST tokens with an empty past."""
    from onnxbuild.steps.benchmarking.decode import decode_step
    from onnxbuild.steps.benchmarking.timing import feeds_prompt

    decoder, step, vocab = decode_step(session, {"batch": 1, "sequence": past or PAST})
    return (
        step if past else decoder.feeds(feeds_prompt({"batch": 1, "sequence": PAST}, vocab), decoder.empty_past(1), 0)
    )


def p50(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def block(fn: Callable[[], None], prepare: Callable[[], None], n: int) -> list[float]:
    """ms of ``n`` calls, ``prepare()`` (untimed) before every SPAN-th."""
    out = []
    for i in range(n):
        if i % SPAN == 0:
            prepare()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main(artifacts: Path) -> None:
    import onnxruntime as ort

    from onnxbuild.report.benchmark import fastest_row
    from onnxbuild.runtimes import openvino_target, sessions

    best = fastest_row(json.loads((artifacts / "benchmark.json").read_text()), {"batch": 1, "sequence": PAST})
    if best is None:
        print(
            f"issue 21's decode line: skipped, no validated row at batch 1, sequence {PAST} in "
            f"{artifacts / 'benchmark.json'}"
        )
        return
    with tempfile.TemporaryDirectory(prefix="onnxbuild-int8-before-") as tmp:
        before = build_before(Path(tmp))
        if isinstance(before, str):
            print(f"issue 21's decode line: skipped, {before}")
            return
        flushed, cpu = sessions.options(), ["CPUExecutionProvider"]
        old = {  # how its code ran it, and how every session runs an artifact today
            f"int8 before the issue ({BEFORE[:7]}) on CPU, ORT defaults": ort.InferenceSession(
                str(before), ort.SessionOptions(), providers=cpu
            ),
            f"int8 before the issue ({BEFORE[:7]}) on CPU, denormals flushed": ort.InferenceSession(
                str(before), flushed, providers=cpu
            ),
        }
        today = "int8 today on CPU"
        label = (
            f"{best['variant']} on {best['provider'].replace('ExecutionProvider', '')} (fastest validated at {PAST})"
        )
        path = artifacts / ("model.onnx" if best["variant"] == "model" else f"{best['variant']}/model.onnx")
        openvino = best["provider"] == "openvino"
        ours = (
            openvino_target.load(path, precision="auto")
            if openvino
            else ort.InferenceSession(str(path), flushed, providers=[best["provider"]])
        )
        held = openvino and ours.keeps_past
        runtimes = {
            label: ours,
            **old,
            today: ort.InferenceSession(str(artifacts / "int8" / "model.onnx"), flushed, providers=cpu),
        }
        # label -> phase -> (call, untimed prepare): a prefill of PAST tokens, one decode step
        # after each past; OpenVINO's calls as its benchmark rows make them (decode_steps, infer)
        calls: dict[str, dict[str, tuple[Callable[[], None], Callable[[], None]]]] = {}
        for key, session in runtimes.items():
            calls[key] = {}
            for past in (0, *PASTS):
                f = feeds(session, past)
                phase = f"decode {past}" if past else "prefill"
                if key == label and openvino:
                    prepare, step = session.decode_steps(f, SPAN)  # an empty past: infer() each call
                    calls[key][phase] = (step, prepare)
                else:
                    calls[key][phase] = ((lambda s=session, f=f: s.run(None, f)), lambda: None)
        times: dict[str, dict[str, list[float]]] = {
            key: {phase: [] for phase in phases} for key, phases in calls.items()
        }
        for r in range(ROUNDS + 1):  # round 0 warms up
            for key, phases in calls.items():
                for phase, (fn, prepare) in phases.items():
                    got = block(fn, prepare, 3 if phase == "prefill" else 6 * SPAN)
                    times[key][phase] += got if r else []
    print(
        f"issue 21's decode line, in one process ({ROUNDS} interleaved rounds; batch 1; p50 of a prefill of "
        f"{PAST} tokens and of one decode step after a past of "
        f"{' and '.join(map(str, PASTS))}"
        f"{f', for a model that holds its cache {SPAN} successive steps from there' if held else ''}):"
    )
    then = {phase: min(p50(times[k][phase]) for k in old) for phase in calls[label]}
    for key, phases in times.items():
        figures = ", ".join(f"{phase} {p50(t):.2f} ms ({p50(t) / then[phase]:.2f}x)" for phase, t in phases.items())
        print(f"  {key:<62} {figures}")
    print("  (x: against the faster of the two runs of the int8 before the issue)")
    for past in PASTS:
        step, was, now = (
            p50(times[label][f"decode {past}"]),
            then[f"decode {past}"],
            p50(times[today][f"decode {past}"]),
        )
        verdict = "holds" if step <= was else "fails"
        what = (
            "the target"
            if past == PAST
            else f"not the target's shape (it names the {PAST}-token prefill), for short prompts"
        )
        print(
            f"  decode step after {past}, {what}: the fastest validated file's no slower than the int8 before the "
            f"issue's: {verdict} ({step:.2f} against {was:.2f} ms, {step / was:.2f}x; against today's int8 "
            f"{now:.2f} ms, {step / now:.2f}x)"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "artifacts" / "gpt2")
