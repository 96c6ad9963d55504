"""The CLI through click's CliRunner, shared by the command-level tests."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from onnxbuild.cli import cli


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
