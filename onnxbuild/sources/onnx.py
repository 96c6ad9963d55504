"""An ONNX file the repository holds: the source step checks it and copies it as model.onnx."""

from __future__ import annotations

from pathlib import Path

from onnxbuild.sources.kind import OnnxFile, OnnxSource, SourceKind


def identity(src: OnnxSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """The file itself (with its external data, read by the source step)."""
    return {"source.onnx.path": recipe_dir / src["path"]}, {}


def estimate_weights(src: OnnxSource, recipe_dir: Path) -> int:
    path = recipe_dir / src["path"]
    return path.stat().st_size if path.is_file() else 0


def onnx_file(src: OnnxSource, recipe_dir: Path) -> OnnxFile:
    return OnnxFile(recipe_dir / str(src["path"]), "source.onnx.path", str(src["path"]))


KIND = SourceKind(name="onnx", traced=False, identity=identity, estimate_weights=estimate_weights, onnx_file=onnx_file)
"""What this kind says of itself (onnxbuild.sources.kind.SourceKind)."""
