"""Shared fixtures: an isolated project folder per test (its own cache and artifacts)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import onnxbuild

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
DATA = Path(__file__).resolve().parent / "data"


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
