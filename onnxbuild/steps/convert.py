"""The ``convert.<name>`` steps: a float16 copy of a variant, validated as a variant of its own.

A recipe lists them like quantize entries::

    convert:
      - {name: fp16, from: optimized}       # keep_io_types: true (float32 inputs and outputs)

Each entry is one variant, ``<name>/model.onnx``, made from the variant ``from`` names with
onnxruntime's float16 converter (weights and compute in float16; Casts at the graph's edges
unless ``keep_io_types: false``; ``op_block_list`` keeps named op types in float32) and held to
the fp16 tolerances of ``recipe.variants.VARIANT_TOLERANCES`` unless its ``validate:`` says
otherwise. Validation, graph contracts, generation and the benchmark take it as they take any
variant: this module, one line in the registry (``spec.STEP_KINDS``) and its schema block are
the whole kind.

ONNX Runtime's CPU provider runs float16 MatMul, LayerNormalization and Gelu by converting
(it has no bfloat16 kernels for them: a bf16 file fails to load there), so the file is for GPUs
and runtimes with float16 units, and is validated here on the CPU like every other variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypedDict, cast

from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.variants import variant
from onnxbuild.spec import Planning, StepInput, StepKind, Variant
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.validating import rules

PACKAGES = ("onnxruntime", "onnx", "numpy")
MEMORY = (3, 400)
"""Peak: the float32 model loaded, its float16 copy, and the interpreter with onnxruntime."""

ConvertEntry = TypedDict(
    "ConvertEntry",
    {
        "name": str,
        "from": Literal["model", "optimized"],  # a keyword: hence the functional form
        "dtype": Literal["fp16"],
        "keep_io_types": bool,
        "op_block_list": list[str],
    },  # and its own tolerances, validate's to read (rules.own)
)
KEYED = ("name", "dtype", "keep_io_types", "op_block_list")
"""What enters a convert step's key: not ``validate:`` (its validate step reads it) nor ``from``
(the file it names is an input, in the key already)."""


def variants(recipe: Recipe, earlier: tuple[Variant, ...]) -> list[Variant]:
    """One per entry, from the variant its ``from`` names, held to fp16's tolerances."""
    entries = cast(list[ConvertEntry], recipe.resolved.get("convert") or [])
    return [
        variant(recipe, e["name"], f"convert.{e['name']}", f"{e['name']}/", "fp16", e["from"], rules.own(e))
        for e in entries
    ]


def plan(p: Planning) -> list[StepSpec]:
    by_name = {v.name: v for v in p.variants}
    steps = []
    for e in cast(list[ConvertEntry], p.recipe.resolved.get("convert") or []):
        base = by_name[e["from"]]
        steps.append(
            StepSpec(
                name=f"convert.{e['name']}",
                kind="convert",
                params={"convert": {k: e[k] for k in KEYED}, "files": list(base.paths)},  # type: ignore[literal-required]
                deps=(base.step,),
                inputs=tuple(StepInput(base.step, f) for f in base.paths),
                outputs=tuple(f"{e['name']}/{Path(f).name}" for f in base.paths),
            )
        )
    return steps


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    from onnxbuild.steps.base import genai_beside

    e = spec.params["convert"]
    size_in = size_out = halves = 0
    for name in spec.params["files"]:
        src, out = ctx.input(name), ctx.output(f"{e['name']}/{Path(name).name}")
        model = OnnxModel(onnx.load_model(str(src)))
        try:
            model.convert_float_to_float16(keep_io_types=e["keep_io_types"], op_block_list=e["op_block_list"] or None)
        except Exception as exc:
            raise StepError(
                f"convert.{e['name']}: onnxruntime's float16 converter failed on {Path(name).name}: "
                f"{type(exc).__name__}: {str(exc)[:400]}"
            ) from None
        halves += sum(1 for t in model.model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16)
        big = model.model.ByteSize() > 2**31 - 2**26  # protobuf's 2 GB limit, with room
        model.save_model_to_file(str(out), use_external_data_format=big, all_tensors_to_one_file=True)
        size_in, size_out = size_in + src.stat().st_size, size_out + out.stat().st_size
    extra = tuple(p.relative_to(ctx.output_dir).as_posix() for p in ctx.output(e["name"]).glob("*.onnx.data"))
    summary = (
        f"float16: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB ({size_out / size_in:.0%}), "
        f"{halves} float16 initializers"
    )
    summary += ", float32 inputs and outputs" if e["keep_io_types"] else ", float16 inputs and outputs"
    if e["op_block_list"]:
        summary += f", kept in float32: {', '.join(e['op_block_list'])}"
    beside = genai_beside(ctx, spec.params["files"][-1], e["name"])
    return StepResult(
        summary=summary,
        data={"bytes_in": size_in, "bytes_out": size_out, "float16_initializers": halves},
        extra_outputs=(*extra, *beside),
    )


KIND = StepKind(
    name="convert",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    variants=variants,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
