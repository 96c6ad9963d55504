"""What every step kind shares: the step types (defined in onnxbuild.spec, the layer below
the kinds) and reading the source step's record."""

from __future__ import annotations

import json

from onnxbuild.spec import Limits, Resources, StepContext, StepInput, StepResult, StepSpec, VariantParam

__all__ = [
    "Limits",
    "Resources",
    "StepContext",
    "StepInput",
    "StepResult",
    "StepSpec",
    "VariantParam",
    "read_source_record",
]


def read_source_record(ctx: StepContext) -> dict[str, object]:
    """reports/source.json, which a torch-traced source's steps take as an input."""
    record: dict[str, object] = json.loads(ctx.input("reports/source.json").read_text(encoding="utf-8"))
    if record.get("weights_file"):  # streamed random-init: the weights came with the record (sources/checkpoint.py)
        record["weights_folder"] = str(ctx.input(str(record["weights_file"])).parent)
    return record


def genai_beside(ctx: StepContext, model_input: str, folder: str) -> tuple[str, ...]:
    """onnxruntime-genai's config next to a variant's file, so ``og.Model("artifacts/x/int4")``
    loads that variant: the same inputs and outputs as the export it was made from."""
    import shutil

    config = ctx.input(model_input).parent / "genai_config.json"
    if not config.is_file():
        return ()
    shutil.copyfile(config, ctx.output(f"{folder}/genai_config.json"))
    return (f"{folder}/genai_config.json",)
