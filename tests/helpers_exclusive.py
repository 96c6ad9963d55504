"""The fake step kind of helpers_engine, declared EXCLUSIVE like the benchmark step."""

from __future__ import annotations

import sys

from helpers_engine import PACKAGES, VERSION, run  # noqa: F401 - re-exported as this kind's contract

from onnxbuild.steps import register

EXCLUSIVE = True
KIND = "fake-exclusive"


def register_exclusive() -> None:
    register(KIND, sys.modules[__name__])
