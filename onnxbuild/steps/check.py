"""The ``check`` step: the ONNX checker, strict shape inference, and an inspect report.

The report answers what a reviewer asks of a model file: which IR and opsets, what
goes in and out (with symbolic dimensions), which ops, how many parameters.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild._util import brief, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.variants import MODEL
from onnxbuild.report.check import CheckReport, TensorReport, markdown
from onnxbuild.spec import Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

if TYPE_CHECKING:
    import onnx

PACKAGES = ("onnx",)


MEMORY = (0.1, 600)
"""Peak as (x the fp32 weights, MB more): the graph and the checker's copy of it; weights in
external data are never loaded (a Llama-3.2-1B shape: 57 MB). A small model's inline weights
come in with the graph (GPT-2 small: about 1 GB), under the base."""


def plan(p: Planning) -> list[StepSpec]:
    """The exported model's file, or each of its files (an encoder-decoder's two)."""
    files = p.variants[0].paths if p.variants else (MODEL,)
    extra = [f"reports/check.{Path(f).stem}.{ext}" for f in files[:-1] for ext in ("json", "md")]
    return [
        StepSpec(
            name="check",
            kind="check",
            params={"files": list(files)} if len(files) > 1 else {},
            deps=(p.model_step,),
            inputs=tuple(StepInput(p.model_step, f) for f in files),
            outputs=("reports/check.json", "reports/check.md", *extra),
        )
    ]


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    """reports/check.json describes the last file (the decoder of two); the others get
    reports/check.<name>.json beside it."""
    files = spec.params.get("files", [MODEL])
    summaries = []
    report: CheckReport | None = None
    parameters = nodes = 0
    for i, name in enumerate(files):
        report = _check(ctx.input(name), name, ctx.output_dir)
        parameters, nodes = parameters + report["parameters"], nodes + report["nodes"]
        stem = "check" if i == len(files) - 1 else f"check.{Path(name).stem}"
        ctx.output(f"reports/{stem}.json").write_text(pretty_json(report), encoding="utf-8")
        ctx.output(f"reports/{stem}.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
        summaries.append(
            f"{report['nodes']} nodes, {report['parameters']:,} parameters" + (f" ({name})" if len(files) > 1 else "")
        )
    assert report is not None
    return StepResult(
        summary=f"ok: {'; '.join(summaries)}, opset {report['opsets'].get('', '?')}",
        data={"parameters": parameters, "nodes": nodes},  # every file's
    )


def _check(path: Path, name: str, scratch: Path) -> CheckReport:
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load_model(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if uses_external_data(t)]
    try:
        if external:
            # A model over 2 GB keeps its weights in a .data file, which the engine hard-links
            # into the step's folder (no copy of gigabytes), and the checker refuses a data file
            # with more than one link ("a potential hardlink attack"). So the graph is checked
            # with those weights as inputs of their types and shapes, and the data file's extents
            # here.
            onnx.checker.check_model(_weights_as_inputs(model, external), full_check=True)
        else:
            onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise StepError(f"the ONNX checker rejected {name}: {brief(exc, lines=3, limit=600)}") from None
    _check_extents(external, path.parent, name)
    inferred = scratch / "inferred.onnx"
    try:
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred), strict_mode=True, check_type=True)
    except Exception as exc:
        raise StepError(f"strict shape inference failed on {name}: {brief(exc, lines=3, limit=600)}") from None
    finally:
        inferred.unlink(missing_ok=True)
    return inspect(model, path)


def _weights_as_inputs(model: onnx.ModelProto, external: list[onnx.TensorProto]) -> onnx.ModelProto:
    """A copy of ``model`` (loaded without its external data) whose external weights are graph
    inputs of the same types and shapes."""
    import onnx

    names = {t.name for t in external}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [t for t in out.graph.initializer if t.name not in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    out.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in external)
    return out


def _check_extents(external: list[onnx.TensorProto], folder: Path, name: str) -> None:
    """Each external weight's bytes lie in a file beside the model, inside it."""
    import math

    import onnx
    from onnx import helper

    for t in external:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        data = folder / location
        if not location or Path(location).is_absolute() or ".." in Path(location).parts or not data.is_file():
            raise StepError(
                f"{name}: weight {t.name!r} is stored in {location!r}, which is not a file beside the model; "
                "keep the .onnx and its .data files together"
            )
        offset = int(info.get("offset", 0))
        # without a length the tensor runs to its size (packed 4-bit types: half a byte each)
        bits = (
            4
            if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
            else 8 * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        )
        length = int(info.get("length", math.ceil(math.prod(t.dims) * bits / 8)))
        if offset + length > data.stat().st_size:
            raise StepError(
                f"{name}: weight {t.name!r} reads bytes {offset}..{offset + length} of {location}, "
                f"which holds {data.stat().st_size}: the data file is truncated or not this model's"
            )


def inspect(model: onnx.ModelProto, path: Path) -> CheckReport:
    import onnx
    from onnx.external_data_helper import uses_external_data

    def tensor(v: onnx.ValueInfoProto) -> TensorReport:
        t = v.type.tensor_type
        dims: list[int | str | None] = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        return {
            "name": v.name,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "unknown",
            "shape": dims,
        }

    params = 0
    param_bytes = 0
    external = 0
    for init in model.graph.initializer:
        count = 1
        for d in init.dims:
            count *= d
        params += count
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        param_bytes += count * itemsize
        if uses_external_data(init):
            external += count * itemsize
    histogram = Counter(n.op_type if not n.domain else f"{n.domain}.{n.op_type}" for n in _all_nodes(model.graph))
    initializer_names = {i.name for i in model.graph.initializer}
    return {
        "passed": True,
        "ir_version": int(model.ir_version),
        "opsets": {o.domain: int(o.version) for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [tensor(v) for v in model.graph.input if v.name not in initializer_names],
        "outputs": [tensor(v) for v in model.graph.output],
        "op_types": dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        "nodes": sum(histogram.values()),
        "initializers": len(model.graph.initializer),
        "parameters": params,
        "parameter_bytes": param_bytes,
        "file_bytes": path.stat().st_size,
        "external_data_bytes": external,
    }


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            if attr.HasField("g"):
                out.extend(_all_nodes(attr.g))
            for g in attr.graphs:
                out.extend(_all_nodes(g))
    return out


KIND = StepKind(name="check", packages=PACKAGES, plan=plan, run=run, memory=MEMORY)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
