"""Shared fixtures: an isolated project folder per test (its own cache and artifacts)."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import onnxbuild

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
DATA = Path(__file__).resolve().parent / "data"

# A suite started in the background of a non-interactive shell (`make test &`, nohup, some CI
# runners) inherits SIGINT ignored, as POSIX has it, and Python then leaves it ignored, in this
# process and in every `onnxbuild` it starts: the tests that send Ctrl-C would see nothing
# happen (exit 0 instead of 130). They test Ctrl-C's handling, so they get Ctrl-C's default:
# a handler here is reset to the default in the processes the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary project folder holding a copy of recipes/, used as the working directory."""
    shutil.copytree(RECIPES, tmp_path / "recipes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ONNXBUILD_CACHE_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield tmp_path


@pytest.fixture
def settings(project: Path) -> onnxbuild.Settings:
    return onnxbuild.Settings(cache_dir=project / ".onnxbuild" / "cache", artifacts_dir=project / "artifacts")
