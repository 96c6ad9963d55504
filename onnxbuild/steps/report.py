"""The ``report`` step: merge each variant's validation into reports/validation.json and .md."""

from __future__ import annotations

import json
from typing import TypedDict, cast

from onnxbuild._util import pretty_json
from onnxbuild.report.validation import markdown
from onnxbuild.spec import Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

PACKAGES: tuple[str, ...] = ()


MEMORY = (0, 200)


class _Part(TypedDict):
    passed: bool
    variants: dict[str, dict[str, object]]


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
    variants: dict[str, dict[str, object]] = {}
    shared: dict[str, object] = {}
    passed: object = True
    for variant in spec.params["variants"]:
        # a validate step's own report (steps/validate.py wrote it): its verdict, each variant's, and shared keys
        part = cast(_Part, json.loads(ctx.input(f"reports/validation/{variant}.json").read_text(encoding="utf-8")))
        for key, value in part.items():
            if key not in ("passed", "variants"):
                shared.setdefault(key, value)
        variants.update(part["variants"])
        passed = passed and part["passed"]
    merged = {**shared, "passed": passed, "variants": variants}
    ctx.output("reports/validation.json").write_text(pretty_json(merged), encoding="utf-8")
    ctx.output("reports/validation.md").write_text(markdown(merged, ctx.recipe_name), encoding="utf-8")
    verdicts = ", ".join(f"{name} {'ok' if v['passed'] else 'FAILED'}" for name, v in variants.items())
    return StepResult(summary=verdicts, data={"passed": passed})


KIND = StepKind(name="report", packages=PACKAGES, plan=plan, run=run, memory=MEMORY)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
