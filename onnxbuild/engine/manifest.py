"""``artifacts/<name>/manifest.json``: what was built, from what, with which digests.

Everything in it is a pure function of the recipe, the package versions and the
step outcomes, so two builds of one recipe on one machine write identical bytes.
Durations and memory figures vary run to run and go to ``timings.json`` beside it.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from onnxbuild.engine.cache import OutputRecord
from onnxbuild.engine.versions import platform_info, versions

Status = Literal["built", "cached", "failed", "skipped"]

MANIFEST_SCHEMA_VERSION = 1


class StepRecord(TypedDict):
    name: str
    kind: str
    key: str | None
    status: Status
    reason: str
    outputs: list[OutputRecord]
    data: dict[str, Any]


class RecipeRecord(TypedDict):
    path: str
    digest: str
    resolved: dict[str, Any]


class Manifest(TypedDict):
    schema_version: int
    name: str
    recipe: RecipeRecord
    steps: list[StepRecord]
    versions: dict[str, str]
    platform: dict[str, str]


def make_manifest(name: str, recipe: RecipeRecord, steps: list[StepRecord]) -> Manifest:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "name": name,
        "recipe": recipe,
        "steps": steps,
        "versions": versions(),
        "platform": platform_info(),
    }
