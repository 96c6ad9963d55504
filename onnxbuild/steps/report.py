"""The ``report`` step: merge each variant's validation into reports/validation.json and .md."""

from __future__ import annotations

import json
from typing import Any

from onnxbuild._util import pretty_json
from onnxbuild.report.validation import markdown
from onnxbuild.spec import Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

VERSION = 3
PACKAGES: tuple[str, ...] = ()


MEMORY = (0, 200)


def plan(p: Planning) -> list[StepSpec]:
    """Every variant's validation merged into reports/validation.json and .md."""
    if not p.recipe.torch_source:
        return []
    reports = [(v.validate_step, v.name) for v in p.variants]
    return [
        StepSpec(
            name="report",
            kind="report",
            params={"variants": [v for _, v in reports]},
            deps=tuple(n for n, _ in reports),
            inputs=tuple(StepInput(n, f"reports/validation/{v}.json") for n, v in reports),
            outputs=("reports/validation.json", "reports/validation.md"),
        )
    ]


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    merged: dict[str, Any] = {"passed": True, "variants": {}}
    for variant in spec.params["variants"]:
        part = json.loads(ctx.input(f"reports/validation/{variant}.json").read_text(encoding="utf-8"))
        for key, value in part.items():
            if key not in ("passed", "variants"):
                merged.setdefault(key, value)
        merged["variants"].update(part["variants"])
        merged["passed"] = merged["passed"] and part["passed"]
    ctx.output("reports/validation.json").write_text(pretty_json(merged), encoding="utf-8")
    ctx.output("reports/validation.md").write_text(markdown(merged, ctx.recipe_name), encoding="utf-8")
    verdicts = ", ".join(f"{name} {'ok' if v['passed'] else 'FAILED'}" for name, v in merged["variants"].items())
    return StepResult(summary=verdicts, data={"passed": merged["passed"]})


KIND = StepKind(name="report", version=VERSION, packages=PACKAGES, plan=plan, run=run, memory=MEMORY)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
