"""The ``quantize.<name>`` steps: dynamic int8, static int8 (calibrated), int4 weight-only.

Defaults are chosen by accuracy, measured here on MiniLM with real weights (embedding
cosine vs PyTorch): per-tensor int8 0.924, per-channel 0.990 at the same speed,
reduce_range 0.83, QUInt8 weights 0.97 but twice as slow. So: per-channel, signed int8
weights, no reduce_range.

The kind (its variants, plan and run) is here; each family of methods is in
steps/quantizing/: ``int8`` (dynamic, static), ``nbits`` (weight-only MatMulNBits), ``gguf``
(a GGUF's own blocks) and ``budgeted`` (4-bit within an accuracy budget).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

from onnxbuild._util import pick
from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.recipe.variants import SOURCE_RECORD, TEXT_GATES, variant, vocab_size
from onnxbuild.sources import section_for, source_kind
from onnxbuild.spec import Checking, Found, Planning, StepInput, StepKind, Variant
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.quantizing.budgeted import by_budget
from onnxbuild.steps.quantizing.gguf import from_gguf
from onnxbuild.steps.quantizing.int8 import dynamic, excluded, static
from onnxbuild.steps.quantizing.nbits import bits_of, streamable, weight_only
from onnxbuild.steps.quantizing.smooth import smooth_int8
from onnxbuild.steps.validating import rules

PACKAGES = ("onnxruntime", "onnx", "numpy")


# The recipe keys each method reads; the others keep their defaults but do nothing, so a
# review of a new variant shows only these.
COMMON_KEYS = ("name", "method", "from", "exclude_nodes", "keep", rules.OWN)


METHOD_KEYS = {
    "dynamic": (*COMMON_KEYS, "per_channel", "reduce_range", "weight_type", "op_types"),
    "static": (
        *COMMON_KEYS,
        "per_channel",
        "reduce_range",
        "weight_type",
        "activation_type",
        "op_types",
        "calibration",
    ),
    "int4": (
        *COMMON_KEYS,
        "block_size",
        "symmetric",
        "accuracy_level",
        "embedding",
        "algorithm",
        "budget",
        "calibration",
    ),
    "weight_only": (
        *COMMON_KEYS,
        "bits",
        "block_size",
        "symmetric",
        "accuracy_level",
        "embedding",
        "algorithm",
        "budget",
        "calibration",
    ),
    "gguf": (*COMMON_KEYS, "accuracy_level", "embedding"),
    "smooth_int8": (*COMMON_KEYS, "calibration", "keep_worst", "block_size", "accuracy_level"),
}


KEYED = {method: tuple(k for k in keys if k not in (rules.OWN, "from")) for method, keys in METHOD_KEYS.items()}
"""What enters a quantize step's key: its method's keys, less ``validate:`` (the variant's
validate step reads it) and ``from`` (the input file it names is in the key already)."""


BUDGETED = ("int4", "weight_only")
"""The methods an accuracy budget plans (steps/budget.py); without one, their calibration is unread."""


MEMORY = (0.8, 600)
"""Peak as (x the fp32 weights, MB more), measured on a Llama-3.2-1B shape's fused graph (4.94 GB
of fp32 weights): 4-bit 3.6 GB and 8-bit 4.6 GB, one MatMul at a time (quant/streamed.py; 10.5 GB
for 4-bit with the whole graph in memory). Dynamic and static int8 still load the whole graph."""


def variants(recipe: Recipe, earlier: tuple[Variant, ...]) -> list[Variant]:
    """One per entry, made from the variant its ``from`` names. A budgeted entry is held, on
    the validation text, to the figures it was planned for (its own ``validate:`` over those)."""
    out = []
    for q in recipe.resolved.get("quantize", []):
        budget = q.get("budget") or {}
        own: dict[str, object] = {**{k: v for k, v in budget.items() if k in TEXT_GATES}, **rules.own(q)}
        out.append(
            variant(
                recipe,
                q["name"],
                f"quantize.{q['name']}",
                f"{q['name']}/",
                precision(q),
                q["from"],
                own,
            )
        )
    return out


def precision(q: QuantizeSection) -> str:
    """The tolerances an entry's variant is held to. A GGUF-exact file computes in float below
    accuracy_level 4 (its weights are the GGUF's, which are the source model's), so it is held
    to fp32's; at 4 its activations are rounded to int8."""
    if q["method"] == "gguf":
        return "int8" if q["accuracy_level"] == 4 else "fp32"
    if q["method"] == "smooth_int8":
        return "int8"
    four = q["method"] == "int4" or (q["method"] == "weight_only" and q["bits"] == 4)
    return "int4" if four else "int8"


def plan(p: Planning) -> list[StepSpec]:
    """One step per ``quantize`` entry, from the variant it names."""
    r = p.recipe.resolved
    by_name = {v.name: v for v in p.variants}
    steps = []
    for q in r.get("quantize", []):
        base = by_name[q["from"]]
        # static int8 calibrates on seeded inputs of the validation shapes unless given an .npz
        seeded = q["method"] == "static" and not q["calibration"]["npz"] and p.recipe.torch_source
        keyed = KEYED[q["method"]]
        budgeted = q["method"] in BUDGETED and q.get("budget") is not None
        if q["method"] in BUDGETED and not budgeted:
            keyed = tuple(k for k in keyed if k not in ("budget", "calibration"))
        planned = budgeted or q["method"] == "smooth_int8"  # a plan from calibration text, in a report
        text = q["calibration"].get("text") if planned else None
        files = {f"quantize.{q['name']}.calibration.text": p.recipe.directory / text} if text else {}
        reads_source = bool(text) or q["method"] == "gguf"  # the GGUF file the source names
        steps.append(
            StepSpec(
                name=f"quantize.{q['name']}",
                kind="quantize",
                params={
                    "quantize": _keyed(q, keyed),
                    "input": base.path,
                    **({"files": list(base.files)} if base.files else {}),
                    **(
                        {
                            "inputs": export_kind.required(r)["inputs"],
                            "shapes": rules.shapes(r),
                            "vocab_size": vocab_size(p.recipe),
                        }
                        if seeded
                        else {}
                    ),
                    **({"source": section_for(r["source"], unset=("package",))} if reads_source else {}),
                },
                deps=(base.step, *(("source",) if reads_source else ())),
                inputs=(
                    *(StepInput(base.step, f) for f in base.paths),
                    *((StepInput("source", SOURCE_RECORD),) if reads_source else ()),
                ),
                outputs=(
                    *(f"{q['name']}/{Path(f).name}" for f in base.paths),
                    *((f"reports/quantize/{q['name']}.json",) if planned or q["method"] == "gguf" else ()),
                ),
                files=files,
            )
        )
    return steps


def _keyed(q: QuantizeSection, keys: tuple[str, ...]) -> dict[str, object]:
    """The entry as its step reads it: static calibration reads no text (that is the budget's)."""
    out: dict[str, object] = pick(q, keys)
    if q["method"] == "static":
        out["calibration"] = pick(q["calibration"], {"method", "samples", "npz"})
    return out


APART = "stage-input"


def _apart(ctx: StepContext, src: Path) -> Path:
    """``src`` itself, or where its external weights are hard-linked from the cache (as the
    engine places them), a copy of it and them in the step's scratch folder: onnx refuses to
    read data with several hard links ("a potential hardlink attack"), and onnxruntime's
    quantizers read through onnx. The copy is deleted when the step is done."""
    import shutil

    data = src.with_name(f"{src.name}.data")
    if not data.is_file() or data.stat().st_nlink < 2:
        return src
    folder = ctx.output_dir / APART
    folder.mkdir(exist_ok=True)
    shutil.copyfile(src, folder / src.name)
    shutil.copyfile(data, folder / data.name)
    return folder / src.name


def _bytes(model: Path) -> int:
    """A model file's size with its external data."""
    data = model.with_name(f"{model.name}.data")
    return model.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnx

    q = cast(QuantizeSection, spec.params["quantize"])
    if spec.params.get("files"):
        return _each_file(ctx, spec, q)
    src = ctx.input(spec.params["input"])
    if not streamable(src, q):  # read one tensor at a time, past onnx's loader, when streamed
        src = _apart(ctx, src)
    out = ctx.output(f"{q['name']}/model.onnx")
    if q["method"] == "gguf":
        return from_gguf(ctx, spec, src, out, q)
    plan = by_budget(ctx, spec, src, out, q) if q.get("budget") else None
    smooth = smooth_int8(ctx, spec, src, out, q) if q["method"] == "smooth_int8" else None
    if plan is None and smooth is None:
        _quantize(ctx, spec, src, out, q, "")
    model = onnx.load_model(str(out), load_external_data=False)
    own_data = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    for extra in out.parent.glob("*.onnx.data"):
        if extra.name not in own_data:  # a quantizer's stray scratch file, not this file's weights
            extra.unlink()
    size_in, size_out = _bytes(src), _bytes(out)
    quantized = sum(
        1
        for n in model.graph.node
        if n.op_type
        in (
            "MatMulInteger",
            "DynamicQuantizeMatMul",
            "QLinearMatMul",
            "MatMulNBits",
            "GatherBlockQuantized",
            "QAttention",
            "DynamicQuantizeLinear",
            "QuantizeLinear",
        )
    )
    summary = (
        f"{q['method']}: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB ({size_out / size_in:.0%}), "
        f"{quantized} quantized nodes"
    )
    from onnxbuild.steps.base import genai_beside

    if q["method"] in ("int4", "weight_only"):
        summary += (
            f", {bits_of(q)}-bit weights ({q['algorithm']}, block {q['block_size']}, "
            f"{'symmetric' if q['symmetric'] and q['algorithm'] == 'rtn' else 'asymmetric'}), "
            f"accuracy_level {q['accuracy_level']}"
        )
    kept = excluded(src, q) if q["keep"] and smooth is None else []
    if kept:
        summary += f", kept in full precision: {', '.join(kept)}"
    beside = genai_beside(ctx, spec.params["input"], q["name"])
    data: dict[str, object] = {"bytes_in": size_in, "bytes_out": size_out, "quantized_nodes": quantized}
    if plan is not None:
        fallback = "float" if plan["kept"] and plan["kept"][0]["bits"] is None else "8 bits"
        summary += (
            f"; budget {', '.join(f'{k} {v:g}' for k, v in plan['budget'].items())}: "
            f"{len(plan['kept'])} of {plan['matmuls']} MatMuls kept at {fallback} "
            f"(calibration: ppl {plan['figures']['ppl_increase']:+.2%}, KL {plan['figures']['kld_mean']:.4f})"
        )
        # what a review should see in the lock file: which layers changed precision
        data["lock"] = {
            "kept": {k["node"]: k["bits"] or "float" for k in plan["kept"]},
            "figures": {k: round(v, 6) for k, v in plan["figures"].items()},
        }
    if smooth is not None:
        alphas = sorted(g["alpha"] for g in smooth["groups"] if g["alpha"])
        summary += (
            f"; SmoothQuant on {len(alphas)} of {len(smooth['groups'])} layer inputs "
            f"(alpha {min(alphas, default=0):g}-{max(alphas, default=0):g}, "
            f"{smooth['calibration']}), {smooth['dynamic']} MatMuls at dynamic int8, "
            f"{len(smooth['kept'])} at 8-bit weight-only"
        )
        # what a review should see in the lock file: each layer input's alpha, the MatMuls kept
        data["lock"] = {
            "alphas": {g["matmuls"][0]: g["alpha"] for g in smooth["groups"]},
            "kept": {k: 8 for k in smooth["kept"]},
        }
    if src.parent.name == APART:
        import shutil

        shutil.rmtree(src.parent)
    weights = tuple(f"{q['name']}/{name}" for name in sorted(own_data))
    return StepResult(summary=summary, data=data, extra_outputs=beside + weights)


def _quantize(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection, where: str) -> None:
    try:
        if q["method"] == "dynamic":
            dynamic(src, out, q)
        elif q["method"] == "static":
            static(ctx, spec, src, out, q)
        elif q["method"] in ("int4", "weight_only"):
            weight_only(src, out, q)
        else:  # smooth_int8 and gguf write their own file; check() keeps them to one-file decoders
            raise StepError(f"quantize.{q['name']}: method {q['method']} does not apply to a multi-file model")
    except StepError:
        raise
    except Exception as exc:
        raise StepError(
            f"quantize.{q['name']} ({q['method']}) failed{where}: {type(exc).__name__}: {str(exc)[:500]}"
        ) from None


def _each_file(ctx: StepContext, spec: StepSpec, q: QuantizeSection) -> StepResult:
    """A multi-file model (an encoder and a decoder): each file quantized the same way."""
    parts = []
    size_in = size_out = 0
    files = spec.params["files"]
    kept = {name: excluded(ctx.input(name), q, each_must_match=False) for name in files}
    for k in q["keep"]:
        if not any(k in node for names in kept.values() for node in names):
            raise StepError(
                f"quantize.{q['name']}.keep: {k!r} is in no MatMul, Gemm or Gather node's name in "
                f"{', '.join(Path(f).name for f in files)}; fix the name or drop it"
            )
    for name in files:
        src, out = ctx.input(name), ctx.output(f"{q['name']}/{Path(name).name}")
        _quantize(ctx, spec, src, out, {**q, "keep": [], "exclude_nodes": kept[name]}, f" on {Path(name).name}")
        size_in, size_out = size_in + src.stat().st_size, size_out + out.stat().st_size
        parts.append(f"{Path(name).name} {src.stat().st_size / 1e6:.1f} -> {out.stat().st_size / 1e6:.1f} MB")
    for extra in ctx.output(q["name"]).glob("*.onnx.data"):
        extra.unlink()
    from onnxbuild.steps.base import genai_beside

    # a vision-language model's genai_config.json names its three files, the same in the variant's folder
    beside = genai_beside(ctx, files[-1], q["name"])
    return StepResult(
        summary=f"{q['method']}: {'; '.join(parts)} ({size_out / size_in:.0%})",
        data={"bytes_in": size_in, "bytes_out": size_out},
        extra_outputs=beside,
    )


def check(c: Checking) -> Iterable[Found]:
    """gguf needs a GGUF source and the fused graph; a budget needs its figures and text."""
    entries = [(i, q) for i, q in enumerate(c.doc.get("quantize") or []) if isinstance(q, dict)]
    for i, q in entries:
        if (c.two_files or c.three_files) and q.get("method") == "static":
            what = "an encoder-decoder" if c.two_files else "a vision-language model"
            yield (
                ("quantize", i, "method"),
                f"static calibration of {what} is not supported; use method: dynamic (or int4)",
                False,
            )
    for i, q in entries if c.traced else ():
        if q.get("method") == "gguf" and not source_kind(c.source).gguf(c.src):
            yield (
                ("quantize", i, "method"),
                "gguf carries a GGUF file's own blocks: the source must name a .gguf file "
                "(source.huggingface.model or package)",
                False,
            )
        elif q.get("method") == "gguf" and q.get("from", "model") != "optimized":
            yield (
                ("quantize", i, "method"),
                "gguf writes the blocks into the fused decoder graph: add from: optimized "
                "(with optimize.decoder: fused)",
                False,
            )
        if q.get("method") == "smooth_int8" and not c.decoder:
            yield (
                ("quantize", i, "method"),
                "smooth_int8 calibrates on text windows through a decoder: it applies to text-generation "
                "models (for an encoder, use method: dynamic or static)",
                True,
            )
        plan = q.get("budget")
        if isinstance(plan, dict) and plan.get("ppl_increase_max") is None and plan.get("kld_max") is None:
            yield (
                ("quantize", i, "budget"),
                "give ppl_increase_max and/or kld_max: "
                "the figures the plan keeps the file within (e.g. {ppl_increase_max: 0.05})",
                True,
            )
        elif isinstance(plan, dict) and q.get("method") not in ("int4", "weight_only"):
            yield (
                ("quantize", i, "budget"),
                "plans weight-only precision per layer: method int4 or weight_only "
                f"(this entry's is {q.get('method')})",
                True,
            )
        elif isinstance(plan, dict) and not c.decoder:
            yield ("quantize", i, "budget"), "measures perplexity on text: it applies to text-generation models", True


KIND = StepKind(
    name="quantize",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    variants=variants,
    check=check,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
