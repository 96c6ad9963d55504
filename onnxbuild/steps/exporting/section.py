"""What later kinds read of the export section (its inputs, sample sizes, precision), apart from
the export kind itself: importing the kind would put its whole run (the fused writer, the VLM
exporter) into every reader's key (``onnxbuild.engine.codekeys``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from onnxbuild._util import pick
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import SIGNATURE_KEYS, ExportSection
from onnxbuild.spec import StepInput

if TYPE_CHECKING:
    from onnxbuild.recipe.model import Recipe


def model_precision(recipe: Recipe) -> str:
    """fp32, or the bits of a fused export's quantized weights (export.weights)."""
    weights = recipe.resolved["export"].get("weights")
    return f"int{weights['bits']}" if weights else "fp32"


def section(resolved: Mapping[str, object]) -> ExportSection | None:
    """A resolved recipe's export section (None for a source that is not traced): what later
    kinds read of it (inputs, sample sizes) without naming it."""
    return cast("ExportSection | None", resolved.get("export"))


def signature(resolved: Mapping[str, object]) -> dict[str, dict[str, object] | None]:
    """The export's inputs, outputs and with_past under the section's name, for a later step's
    params (in its key: a new input reruns it); None for a source that is not traced."""
    found = section(resolved)
    return {"export": pick(found, SIGNATURE_KEYS) if found else None}


def whole(resolved: Mapping[str, object]) -> dict[str, ExportSection | None]:
    """The whole export section under its name, for a step that reads its sample sizes too."""
    return {"export": section(resolved)}


def of(params: Mapping[str, object]) -> ExportSection | None:
    """What :func:`signature` or :func:`whole` put in a step's params."""
    return cast("ExportSection | None", params.get("export"))


def required(params: Mapping[str, object]) -> ExportSection:
    """:func:`of` for a step that runs only for a traced source (validate)."""
    found = of(params)
    if found is None:
        raise StepError("this step validates a traced model, and its params hold no export section (a bug)")
    return found


CONFIG_INPUT = StepInput("export", "config.json")
"""The model's config.json, which export writes beside a transformers model."""
