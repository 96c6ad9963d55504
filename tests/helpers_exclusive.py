"""The fake step kind of helpers_engine, declared exclusive like the benchmark step."""

from __future__ import annotations

import sys
from dataclasses import replace

from helpers_engine import KIND as FAKE
from helpers_engine import run  # noqa: F401 - the entry point a step process calls

from onnxbuild.steps import register

NAME = "fake-exclusive"
KIND = replace(FAKE, name=NAME, exclusive=True)


def register_exclusive() -> None:
    register(NAME, sys.modules[__name__])
