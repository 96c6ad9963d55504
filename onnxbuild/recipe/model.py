"""The recipe as the rest of onnxbuild sees it: resolved, validated, immutable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxbuild.recipe.sections import Resolved


def is_torch_source(source: Mapping[str, object]) -> bool:
    """Whether the model is a framework model to export (the source kind says: its module's
    ``traced``); a ``huggingface.file`` source is an ONNX file already, like an onnx source."""
    from onnxbuild.sources import traced

    return traced(source)


@dataclass(frozen=True)
class Recipe:
    """A loaded recipe.

    Attributes:
        name: the artifact folder name (``artifacts/<name>/``).
        path: the recipe file as the user named it (used in messages).
        directory: the folder relative paths in the recipe are resolved against.
        digest: sha256 of the file's bytes.
        resolved: the recipe with every default filled in; what ``show`` prints and the cache hashes.
    """

    name: str
    path: str
    directory: Path
    digest: str
    resolved: Resolved

    @property
    def source_kind(self) -> str:
        kind: str = next(iter(self.resolved["source"]))
        return kind

    @property
    def torch_source(self) -> bool:
        return is_torch_source(self.resolved["source"])

    @property
    def source(self) -> dict[str, object]:
        return self.resolved["source"][self.source_kind]
