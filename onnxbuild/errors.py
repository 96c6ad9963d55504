"""One error hierarchy: everything a user can cause or fix is an ``OnnxbuildError``.

The CLI turns these into ``Error: <message>`` and an exit code, never a traceback:
``RecipeError`` and ``UsageError`` exit 2 (the input is wrong), ``StepError`` and
``BuildFailed`` exit 1 (the input is fine but the build did not succeed).
"""

from __future__ import annotations

from dataclasses import dataclass

INTERRUPTED = "Interrupted; nothing partial was kept (completed steps stay cached)."
"""What a build stopped by Ctrl-C or SIGTERM says (exit 130), wherever the signal lands."""
INTERRUPTED_EXIT = 130


class OnnxbuildError(Exception):
    """Root of every error onnxbuild raises on purpose."""

    exit_code = 1


class UsageError(OnnxbuildError):
    """A command was called wrongly (bad option value, missing file)."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe, located in its file."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class RecipeError(OnnxbuildError):
    """A recipe is malformed; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class StepError(OnnxbuildError):
    """A step ran and failed for a reason it can explain (raised inside steps)."""


class CacheError(OnnxbuildError):
    """The cache cannot be used (unwritable directory, lock trouble)."""


class BuildFailed(OnnxbuildError):
    """At least one step failed; the message names them and what was skipped."""
