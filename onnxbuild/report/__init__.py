"""Schemas of the JSON files onnxbuild writes under artifacts/, shipped for consumers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from onnxbuild._util import JsonValue


@cache
def benchmark_schema() -> dict[str, JsonValue]:
    # our own file, a JSON object
    data: dict[str, JsonValue] = json.loads(
        (Path(__file__).parent / "benchmark.schema.json").read_text(encoding="utf-8")
    )
    return data
