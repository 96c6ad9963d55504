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
from collections.abc import Mapping

from onnxbuild import environment
from onnxbuild._util import pretty_json
from onnxbuild.spec import Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.benchmarking.section import section as benchmark_section
from onnxbuild.steps.benchmarking.section import threads_of, threads_params

PACKAGES = ("torch", "onnxruntime", "numpy")
EXCLUSIVE = True
"""Peaks are only peaks when nothing else runs."""

MEMORY = (1, 900)
BUDGET_S = 0.15
"""Seconds spent repeating each figure (at least 3 calls each, after 2 warm-ups; a peak is the
best call): about 2 s for the four with the imports, paid once per machine."""
PEAKS = "reports/machine.json"
PEAKS_INPUT = StepInput("machine", PEAKS)
"""The machine's limits, as a step that divides its figures by them reads them."""


def plan(p: Planning) -> list[StepSpec]:
    bench = benchmark_section(p.recipe.resolved)
    if not bench:
        return []
    return [
        StepSpec(
            name="machine",
            kind="machine",
            params=threads_params(bench),
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


def measured(params: Mapping[str, object]) -> str:
    return "peak figures differ run to run"


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    from onnxbuild.report.benchmark import limits_line
    from onnxbuild.steps.peaks import measure_peaks

    threads = threads_of(spec.params) or (os.cpu_count() or 1)
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
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    exclusive=EXCLUSIVE,
    measured=measured,
    imports=("torch", "onnxruntime"),
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
