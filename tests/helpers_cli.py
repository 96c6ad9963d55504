"""The CLI through click's CliRunner, shared by the command-level tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from onnxbuild.cli import cli


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def built_once(root: Path, source: Path, folder: str, recipe: str) -> Path:
    """``root`` with ``source`` copied in as ``folder`` and ``recipe`` built there once (a
    module-scoped fixture's project: copy it to change it)."""
    shutil.copytree(source, root / folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("ONNXBUILD_CACHE_DIR", raising=False)
        result = run("make", recipe)
    assert result.exit_code == 0, result.output
    return root
