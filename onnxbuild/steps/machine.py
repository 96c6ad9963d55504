"""The ``machine`` step: this machine's limits (GEMM peaks per precision, memory bandwidth),
measured once per CPU and thread count and kept in the cache like any output.

Its key is the CPU's model and feature flags, the thread count and the packages that run
the micro-benchmarks, and nothing of the recipe: every recipe's benchmark on this machine
reads the same entry, and a runner of another kind measures its own (see
onnxbuild/steps/roofline.py for what is measured and how).

Figures measured while another job ran are low (fp32 GEMM 33 GFLOP/s against 241 quiet, seen
once and then cached for good): the timed calls' share of their threads' CPU time is measured
with them, and below ``roofline.LOADED_BELOW`` the report says so and the cache keeps no entry
(``StepResult.keep``), so the next build measures again.
"""

from __future__ import annotations

import os

from onnxbuild import environment
from onnxbuild._util import pick, pretty_json
from onnxbuild.spec import Planning, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

VERSION = 2
PACKAGES = ("torch", "onnxruntime", "numpy")
EXCLUSIVE = True
"""Peaks are only peaks when nothing else runs."""

MEMORY = (1, 900)
BUDGET_S = 0.15
"""Seconds spent repeating each figure (at least 3 calls each, after 2 warm-ups; a peak is the
best call): about 2 s for the four with the imports, paid once per machine."""
PEAKS = "reports/machine.json"


def plan(p: Planning) -> list[StepSpec]:
    bench = p.recipe.resolved.get("benchmark")
    if not bench:
        return []
    return [
        StepSpec(
            name="machine",
            kind="machine",
            params={"benchmark": pick(bench, {"threads"})},
            outputs=(PEAKS,),
            identity={
                "machine": {
                    "cpu": environment.cpu_info()[0],
                    "features": environment.cpu_fingerprint(),
                    "threads": os.cpu_count(),
                }
            },
        )
    ]


def measured(params: dict[str, object]) -> str:
    return "peak figures differ run to run"


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    from onnxbuild.report.benchmark import limits_line
    from onnxbuild.steps.peaks import measure_peaks

    threads = int(spec.params["benchmark"]["threads"] or (os.cpu_count() or 1))
    found = measure_peaks(threads, budget_s=BUDGET_S)
    peaks = found.as_dict()
    report = {
        "cpu": environment.cpu_info()[0],
        "fingerprint": environment.cpu_fingerprint(),
        **peaks,
        "loaded": found.loaded,
    }
    ctx.output(PEAKS).write_text(pretty_json(report), encoding="utf-8")
    summary = limits_line(dict(peaks))
    warnings: tuple[str, ...] = ()
    if found.loaded:
        warnings = (
            f"the machine was busy: the peaks' timed calls got {found.cpu_share:.0%} of {threads} threads' CPU time, "
            "so they are low; not cached, measured again next build",
        )
    return StepResult(
        summary=summary,
        data={"fp32_gflops": peaks["fp32_gflops"], "memory_gbps": peaks["memory_gbps"], "loaded": found.loaded},
        warnings=warnings,
        keep=not found.loaded,
    )


KIND = StepKind(
    name="machine",
    version=VERSION,
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    exclusive=EXCLUSIVE,
    measured=measured,
    imports=("torch", "onnxruntime"),
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
