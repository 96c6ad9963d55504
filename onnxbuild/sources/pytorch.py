"""Any ``torch.nn.Module`` from a factory function, optionally with a checkpoint.

A recipe that names a factory runs that code: a recipe is code, like a Makefile.
The factory file's content digest is part of the identity, so editing it rebuilds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.sources import usercode
from onnxbuild.sources.kind import Problem, PytorchSource, SourceKind, SourceRecord

if TYPE_CHECKING:
    import torch


def factory_files(src: PytorchSource, recipe_dir: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    found = usercode.file_path(src["factory"], recipe_dir)
    if found is not None:
        files["source.pytorch.factory"] = found
    if checkpoint := src.get("checkpoint"):
        files["source.pytorch.checkpoint"] = recipe_dir / checkpoint
    return files


def record(src: PytorchSource, recipe_dir: Path, digests: dict[str, str]) -> SourceRecord:
    usercode.check_defines(src["factory"], recipe_dir, "source.pytorch.factory")
    missing = [label for label, digest in digests.items() if digest == "missing"]
    if missing:
        raise StepError(f"{missing[0]}: file not found (paths are relative to the recipe's folder, {recipe_dir})")
    return {
        "kind": "pytorch",
        "factory": src["factory"],
        "kwargs": src["kwargs"],
        "files": dict(digests),
        "seed": src["seed"],
        "weights": "checkpoint" if src.get("checkpoint") else "factory",
    }


def load_factory(src: PytorchSource, recipe_dir: Path) -> Callable[..., object]:
    return usercode.load_function(src["factory"], recipe_dir, "source.pytorch.factory")


def load_model(src: PytorchSource, record: Mapping[str, object], recipe_dir: Path) -> torch.nn.Module:
    import torch

    fn = load_factory(src, recipe_dir)
    torch.manual_seed(int(src["seed"]))
    try:
        model = fn(**src["kwargs"])
    except Exception as exc:
        raise StepError(f"source.pytorch.factory: {src['factory']} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise StepError(
            f"source.pytorch.factory: {src['factory']} returned {type(model).__name__}, not a torch.nn.Module"
        )
    if checkpoint := src.get("checkpoint"):
        path = recipe_dir / checkpoint
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state)
        except Exception as exc:
            raise StepError(
                f"source.pytorch.checkpoint: cannot load {src['checkpoint']}: {type(exc).__name__}: {str(exc)[:300]}"
            ) from None
    model.eval()
    return model


def identity(src: PytorchSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """The factory's file and the checkpoint: editing either rebuilds."""
    return factory_files(src, recipe_dir), {}


def estimate_weights(src: PytorchSource, recipe_dir: Path) -> int:
    return 64 * 1024 * 1024  # unknown before the factory runs


def check(src: PytorchSource, doc: Mapping[str, object]) -> Iterable[Problem]:
    """The factory reference is well formed."""
    wrong = usercode.ref_problem(src["factory"]) if isinstance(src.get("factory"), str) else None
    if wrong:
        yield ("source", "pytorch", "factory"), wrong, False


KIND = SourceKind(
    name="pytorch",
    traced=True,
    imports=("torch",),
    identity=identity,
    estimate_weights=estimate_weights,
    record=record,
    load_model=load_model,
    check=check,
    needs_inputs="name, dtype and shape of each model input",
)
"""What this kind says of itself (onnxbuild.sources.kind.SourceKind)."""
