"""The ``source`` step: materialise the model (onnx, graph) or record what the model is (torch sources)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild._util import pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.variants import MODEL, SOURCE_RECORD
from onnxbuild.sources import section_for, source_kind
from onnxbuild.spec import Planning, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

if TYPE_CHECKING:
    import onnx

PACKAGES = ("onnx",)


MEMORY = (0, 300)
"""Peak memory: (multiple of the model's weights, MB on top); see pipeline._resources."""


def plan(p: Planning) -> list[StepSpec]:
    """One step: a traced source's record (which weights, the digests of the files it
    names), or model.onnx for an onnx or graph source."""
    recipe = p.recipe
    described = source_kind(recipe.source_kind)
    files, identity = described.identity(recipe.source, recipe.directory)
    outputs = (SOURCE_RECORD,) if recipe.torch_source else (MODEL,)
    return [
        StepSpec(
            name="source",
            kind="source",
            params={"source": section_for(recipe.resolved["source"], drop=described.later)},
            outputs=outputs,
            files=files,
            identity=identity,
        )
    ]


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    ((kind, src),) = spec.params["source"].items()
    described = source_kind(kind)
    if described.build_onnx is not None:
        return _built(ctx, described.build_onnx(src))
    named = described.onnx_file(src, ctx.recipe_dir) if described.onnx_file is not None else None
    if named is not None:
        result = _onnx_file(ctx, named.path, named.key, named.shown)
        return replace(result, summary=f"{named.shown} from {named.where}") if named.where else result
    record_of = described.record
    if record_of is None:
        raise StepError(f"a {kind} source writes model.onnx, not a record (a bug: source.{kind} has no record)")
    record = record_of(src, ctx.recipe_dir, ctx.digests)
    ctx.output("reports/source.json").write_text(pretty_json(record), encoding="utf-8")
    weights = str(record["weights"])
    note = f"weights: {weights}" + (f" ({record['why']})" if record.get("why") else "")
    written = described.write_weights(src, record, ctx.output_dir) if described.write_weights else ""
    extra = tuple(str(p.relative_to(ctx.output_dir)) for p in sorted(ctx.output_dir.glob("weights/*")))
    return StepResult(
        summary=f"{note}; {written}" if written else note,
        data={"weights": weights, "why": record.get("why", "")},
        extra_outputs=extra,
    )


def _built(ctx: StepContext, model: onnx.ModelProto) -> StepResult:
    import onnx

    onnx.save_model(model, str(ctx.output("model.onnx")))
    return StepResult(summary=f"graph with {len(model.graph.node)} nodes")


def _onnx_file(ctx: StepContext, path: Path, key: str, shown: str) -> StepResult:
    import onnx

    try:
        found = path.is_file()
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise StepError(
            f"{key}: the system cannot open {shown[:80]}... ({exc.strerror}); give a shorter path"
        ) from None
    if not found:
        raise StepError(f"{key}: {path} does not exist (paths are relative to the recipe's folder)")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:
        raise StepError(f"{key}: {shown} is not an ONNX model ({type(exc).__name__}: {exc})") from None
    shutil.copyfile(path, ctx.output("model.onnx"))
    extra = []
    for tensor in _external_tensors(model):
        location = next(e.value for e in tensor.external_data if e.key == "location")
        rel = Path(location)
        if rel.is_absolute() or ".." in rel.parts:
            raise StepError(
                f"{key}: {shown} names external data outside its folder ({location}); onnxbuild refuses to read it"
            )
        dest = ctx.output(rel.as_posix())
        if not dest.exists():
            shutil.copyfile(path.parent / rel, dest)
            extra.append(rel.as_posix())
    return StepResult(summary=f"copied {shown}", extra_outputs=tuple(extra))


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


KIND = StepKind(
    name="source",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    writes_model=lambda recipe: not recipe.torch_source,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
