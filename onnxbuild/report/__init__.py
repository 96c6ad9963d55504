"""Schemas of the JSON files onnxbuild writes under artifacts/, shipped for consumers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any


@cache
def benchmark_schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(__file__).parent / "benchmark.schema.json").read_text(encoding="utf-8"))
    return data
