"""What every step kind shares: the step types (defined in onnxbuild.spec, the layer below
the kinds) and reading the source step's record."""

from __future__ import annotations

import json
from typing import TypedDict

from onnxbuild.spec import Limits, Resources, StepContext, StepInput, StepResult, StepSpec

__all__ = [
    "Limits",
    "Resources",
    "StepContext",
    "StepInput",
    "StepResult",
    "StepSpec",
    "VariantParam",
    "read_source_record",
]


class _VariantNamed(TypedDict):
    name: str
    path: str
    precision: str


class VariantParam(_VariantNamed, total=False):
    """How ``Variant.as_param`` names a variant in a step's params (generate, benchmark)."""

    files: list[str]
    prefill: str


def read_source_record(ctx: StepContext) -> dict[str, object]:
    """reports/source.json, which a torch-traced source's steps take as an input."""
    record: dict[str, object] = json.loads(ctx.input("reports/source.json").read_text(encoding="utf-8"))
    return record
