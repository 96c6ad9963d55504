"""A test hook to stop a command at a named point; standard library only, so the entry point
can use it before anything else loads. Not for users."""

from __future__ import annotations

import os
import time
from pathlib import Path

TEST_PAUSE_ENV = "ONNXBUILD_TEST_PAUSE"


def pause_for_tests(point: str, detail: str) -> None:
    """Test hook: with ONNXBUILD_TEST_PAUSE="<point>:<detail>:<seconds>:<marker file>", sleep
    at that point of a write, after creating the marker file, so a test can SIGKILL a build
    exactly there (tests/test_crashes.py). An empty detail matches any. Not for users.

    Points: ``startup`` (detail: empty) in the entry point once its signal handlers are in
    place, before the command's modules load; ``exit`` (detail: the exit code) once the
    command has finished, before Python shuts down; ``cache-write`` (detail: the step) in ``Cache.commit`` once the step's first
    output is in objects/ and before its entry exists; ``materialise`` (detail: the
    artifact's path) once an artifact is linked under its temporary name, before the rename;
    ``manifest-write`` (detail: the recipe) once the new manifest is written under its
    temporary name, before the rename.
    """
    value = os.environ.get(TEST_PAUSE_ENV)
    if not value:
        return
    want_point, want_detail, seconds, marker = [*value.split(":", 3), "", "", ""][:4]
    if want_point != point or want_detail not in ("", detail):
        return
    if marker:
        Path(marker).write_text(f"{point}:{detail}:{os.getpid()}\n", encoding="utf-8")
    time.sleep(float(seconds or 0))
