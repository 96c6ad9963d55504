"""What other modules read of the benchmark kind without naming it: its section of a resolved
recipe, its step's name and the report it writes (the machine step reads the threads, a
diff compares two builds' reports)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, cast

from onnxbuild._util import pick
from onnxbuild.recipe.sections import BenchmarkSection

STEP = "benchmark"
"""The benchmark kind's one step per recipe."""
REPORT = "benchmark.json"


def section(resolved: Mapping[str, object]) -> BenchmarkSection | None:
    """The recipe's benchmark section (None when it has none)."""
    return cast("BenchmarkSection | None", resolved.get(STEP) or None)


class ThreadsParams(TypedDict):
    threads: int | None


def threads_params(bench: BenchmarkSection) -> dict[str, ThreadsParams]:
    """The threads the figures are measured with, under the section's name (as keyed)."""
    return {STEP: pick(bench, {"threads"})}


def threads_of(params: Mapping[str, object]) -> int | None:
    threads = cast(ThreadsParams, params[STEP])["threads"]  # as threads_params put it in the step's params
    return int(threads) if threads else None
