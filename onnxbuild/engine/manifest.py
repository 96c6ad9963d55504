"""``artifacts/<name>/manifest.json``: what was built, from what, with which digests.

Everything in it is a pure function of the recipe, the package versions and the
step outputs, so two builds of one recipe on one machine write identical bytes, whether
a step was built, taken from the cache or resumed after a kill. What varies run to run
(each step's status and reason, durations, memory) goes to ``timings.json`` beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal, TypedDict

from onnxbuild.engine.cache import OutputRecord
from onnxbuild.environment import package_version, platform_info, versions

Status = Literal["built", "cached", "failed", "skipped"]

MANIFEST_SCHEMA_VERSION = 2
"""2: step status and reason moved to timings.json (they differ between a build and a no-op rebuild)."""


class _Attempts(TypedDict, total=False):
    attempts: int
    """How many times it ran in this build, where more than once (a Ray worker that died)."""


class StepRecord(_Attempts):
    """A step as this build reports it: its key, status (built, cached, pulled, failed, skipped) and why."""

    name: str
    kind: str
    key: str | None
    status: Status
    reason: str
    outputs: list[OutputRecord]
    data: dict[str, object]


class ManifestStep(TypedDict):
    """A step as the manifest records it: what it is and what it wrote, not how this run got it."""

    name: str
    kind: str
    key: str | None
    outputs: list[OutputRecord]
    data: dict[str, object]


def manifest_step(record: StepRecord) -> ManifestStep:
    return {
        "name": record["name"],
        "kind": record["kind"],
        "key": record["key"],
        "outputs": record["outputs"],
        "data": record["data"],
    }


class RecipeRecord(TypedDict):
    """The recipe a manifest was built from: path, digest of its bytes, every resolved key."""

    path: str
    digest: str
    resolved: Mapping[str, object]


class Manifest(TypedDict):
    """artifacts/<name>/manifest.json: the recipe, each step's key and outputs, package versions, platform."""

    schema_version: int
    name: str
    recipe: RecipeRecord
    steps: list[ManifestStep]
    versions: dict[str, str]
    platform: dict[str, str]


class StepTiming(TypedDict):
    """One step in ``timings.json``: how this run got it, and what it cost."""

    status: Status | None
    reason: str | None
    seconds: float
    build_seconds: float | None
    """What building it cost when its output was made (this run, or the build it was cached from)."""
    peak_rss_mb: float | None


class Timings(TypedDict):
    """``timings.json`` beside the manifest: what varies run to run."""

    steps: dict[str, StepTiming]


def make_manifest(
    name: str, recipe: RecipeRecord, steps: list[StepRecord], lookup: Callable[[str], str] = package_version
) -> Manifest:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "name": name,
        "recipe": recipe,
        "steps": [manifest_step(s) for s in steps],
        "versions": versions(lookup=lookup),
        "platform": platform_info(),
    }
