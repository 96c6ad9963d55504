"""The ``serve.<name>`` steps: a decoder served by two files, one for the prompt and one for
each token after it, as one variant of its own.

A recipe pairs two variants it builds::

    serve:
      - {name: int4-served, decode: int4, prefill: int8}

The folder ``int4-served/`` then holds ``model.onnx`` (``decode``'s file: every step after the
first), ``prefill.onnx`` (``prefill``'s file: the first call, which reads the whole prompt) and a
``genai_config.json`` of onnxruntime-genai's ``decoder-pipeline`` type that runs the first on the
prompt and the second on token generation. ``onnxbuild run`` reads the folder the same way.

Why: the kernels that make one token fast are not the ones that make a 128-token prompt fast.
On SmolLM2-135M (2-core EPYC) a 4-bit file decodes a token in 6-7 ms but prefills 128 tokens in
150-180 ms, where 8-bit weights prefill in 144 ms: MatMulNBits' 4-bit kernels are built for
one row. The price is memory: both files are loaded. The copies cost no disk: the cache stores
objects by content and the artifact folder hard-links them.

The two files must take and return the same tensors (one export, one KV-cache layout); the step
checks that. The variant is validated as served: shapes without a past go through the prefill
file, shapes with one through the decode file, and ``validate.text`` windows are prefilled
for their first half and decoded token by token for the rest. Its precision, and so its
default tolerances, are the lower of the two; the benchmark times its prefill on the prefill
file and its decode steps on the decode file.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict, cast

from onnxbuild._util import pretty_json
from onnxbuild.errors import StepError
from onnxbuild.layouts.generation import PREFILL_FILE
from onnxbuild.recipe.checks import refuse_three_files
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.sections import VariantValidate
from onnxbuild.spec import Checking, Found, Planning, StepInput, StepKind, Variant
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.validating import rules

PACKAGES = ("onnx", "transformers")
MEMORY = (1, 400)
"""Peak: one file's graph read for its inputs and outputs (the copies stream)."""

DECODE_FILE = "model.onnx"
LOWEST_FIRST = ("int4", "int8", "fp16", "fp32")


class ServeEntry(TypedDict):
    name: str
    decode: str
    prefill: str
    validate: VariantValidate


def _entries(recipe: Recipe) -> list[ServeEntry]:
    return cast(list[ServeEntry], recipe.resolved.get("serve") or [])


def variants(recipe: Recipe, earlier: tuple[Variant, ...]) -> list[Variant]:
    """One per entry, pairing variants the kinds before this one made, held to the lower
    precision of its two files (the entry's own ``validate:`` over the decode variant's)."""
    entries = _entries(recipe)
    if not entries:
        return []
    built = {v.name: v for v in earlier}
    out = []
    for e in entries:
        decode, prefill = built[e["decode"]], built[e["prefill"]]
        precision = min(decode.precision, prefill.precision, key=LOWEST_FIRST.index)
        out.append(
            Variant(
                e["name"],
                f"serve.{e['name']}",
                f"{e['name']}/{DECODE_FILE}",
                precision,
                own={**decode.own, **rules.own(e)},
                prefill=f"{e['name']}/{PREFILL_FILE}",
            )
        )
    return out


def plan(p: Planning) -> list[StepSpec]:
    by_name = {v.name: v for v in p.variants}
    steps = []
    for e in _entries(p.recipe):
        decode, prefill = by_name[e["decode"]], by_name[e["prefill"]]
        steps.append(
            StepSpec(
                name=f"serve.{e['name']}",
                kind="serve",
                params={
                    "serve": {"name": e["name"], "decode": decode.name, "prefill": prefill.name},
                    "decode_path": decode.path,
                    "prefill_path": prefill.path,
                },
                deps=tuple(dict.fromkeys((p.model_step, decode.step, prefill.step))),
                inputs=(
                    StepInput(p.model_step, "config.json"),
                    StepInput(decode.step, decode.path),
                    StepInput(prefill.step, prefill.path),
                ),
                outputs=(
                    f"{e['name']}/{DECODE_FILE}",
                    f"{e['name']}/{PREFILL_FILE}",
                    f"{e['name']}/genai_config.json",
                ),
            )
        )
    return steps


def _signature(path: Path) -> tuple[list[tuple[str, int, tuple[int | str, ...]]], list[str], bool]:
    """(inputs with their element types and shapes, output names, whether its weights sit in a
    data file beside it)."""
    import onnx

    model = onnx.load_model(str(path), load_external_data=False)
    inputs = [
        (
            i.name,
            i.type.tensor_type.elem_type,
            tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim),
        )
        for i in model.graph.input
    ]
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    return inputs, [o.name for o in model.graph.output], external


def _place(src: Path, out: Path, external: bool) -> None:
    """``src`` as ``out``: a byte copy (the cache keeps one object for both), or, for a file
    whose weights sit in a data file beside it (``external``), re-saved with its own data file."""
    import onnx

    if not external:
        shutil.copyfile(src, out)
        return
    model = onnx.load_model(str(src))
    onnx.save_model(
        model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{out.name}.data"
    )


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    from transformers import AutoConfig

    from onnxbuild.sources.decoder import PAST_PREFIX, PastLayout, genai_config, genai_pipeline

    e = spec.params["serve"]
    decode, prefill = ctx.input(spec.params["decode_path"]), ctx.input(spec.params["prefill_path"])
    (d_in, d_out, d_external), (p_in, p_out, p_external) = _signature(decode), _signature(prefill)
    if d_in != p_in or d_out != p_out:
        differ = sorted({i[:2] for i in d_in} ^ {i[:2] for i in p_in})
        shown = [f"input {n}" for n, _ in differ] + [f"output {n}" for n in sorted(set(d_out) ^ set(p_out))]
        raise StepError(
            f"serve.{e['name']}: {e['decode']} and {e['prefill']} do not take and return the same tensors "
            f"({', '.join(shown[:6]) or 'the same names, other shapes'}); pair two variants of one export"
        )
    past = [shape for name, _, shape in d_in if name.startswith(PAST_PREFIX)]
    if not past:
        raise StepError(
            f"serve.{e['name']}: {e['decode']} takes no past_key_values inputs; "
            "a decoder is served by two files only when it is exported with export.with_past: true"
        )
    _place(decode, ctx.output(f"{e['name']}/{DECODE_FILE}"), d_external)
    _place(prefill, ctx.output(f"{e['name']}/{PREFILL_FILE}"), p_external)
    folder = ctx.output_dir / e["name"]
    layout = PastLayout(layers=len(past) // 2, kv_heads=int(past[0][1]), head_dim=int(past[0][3]))
    names = [name for name, _, _ in d_in]
    config = AutoConfig.from_pretrained(str(ctx.input("config.json").parent))
    single = genai_config(config, layout, names)
    doc = genai_pipeline(single, names, d_out, prefill=PREFILL_FILE, decode=DECODE_FILE)
    (folder / "genai_config.json").write_text(pretty_json(doc), encoding="utf-8")
    extra = tuple(p.relative_to(ctx.output_dir).as_posix() for p in folder.glob("*.onnx.data"))
    sizes = {p.name: p.stat().st_size for p in (folder / DECODE_FILE, folder / PREFILL_FILE)}
    return StepResult(
        summary=(
            f"prefill with {e['prefill']} ({sizes[PREFILL_FILE] / 1e6:.1f} MB), decode with {e['decode']} "
            f"({sizes[DECODE_FILE] / 1e6:.1f} MB)"
        ),
        data={"decode": e["decode"], "prefill": e["prefill"], "bytes": sizes},
        extra_outputs=extra,
    )


def check(c: Checking) -> Iterable[Found]:
    yield from refuse_three_files(c, "serve")


KIND = StepKind(name="serve", packages=PACKAGES, plan=plan, run=run, memory=MEMORY, variants=variants, check=check)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
