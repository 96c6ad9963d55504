"""The ``quantize.<name>`` steps: dynamic int8, static int8 (calibrated), int4 weight-only.

Defaults are chosen by accuracy, measured here on MiniLM with real weights (embedding
cosine vs PyTorch): per-tensor int8 0.924, per-channel 0.990 at the same speed,
reduce_range 0.83, QUInt8 weights 0.97 but twice as slow. So: per-channel, signed int8
weights, no reduce_range.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

from onnxbuild._util import pick, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.model import Recipe
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.recipe.variants import SOURCE_RECORD, TEXT_GATES, variant, vocab_size
from onnxbuild.sources import section_for
from onnxbuild.sources.decoder import PAST_PREFIX as PAST
from onnxbuild.spec import Planning, StepInput, Variant
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.budget import PrecisionPlan

VERSION = 5
PACKAGES = ("onnxruntime", "onnx", "numpy")

# The recipe keys each method reads; the others keep their defaults but do nothing, so a
# review of a new variant shows only these.
COMMON_KEYS = ("name", "method", "from", "exclude_nodes", "keep", "validate")
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
}


KEYED = {method: tuple(k for k in keys if k not in ("validate", "from")) for method, keys in METHOD_KEYS.items()}
BUDGETED = ("int4", "weight_only")
DEFAULT_MARGIN = 0.5
"""budget.margin: the share of each budget figure the plan must meet on the calibration text."""
"""The methods an accuracy budget plans (steps/budget.py); without one, their calibration is unread."""
"""What enters a quantize step's key: its method's keys, less ``validate:`` (the variant's
validate step reads it) and ``from`` (the input file it names is in the key already)."""

MEMORY = (3, 400)


def variants(recipe: Recipe) -> list[Variant]:
    """One per entry, made from the variant its ``from`` names. A budgeted entry is held, on
    the validation text, to the figures it was planned for (its own ``validate:`` over those)."""
    out = []
    for q in recipe.resolved.get("quantize", []):
        budget = q.get("budget") or {}
        own = {**{k: budget[k] for k in TEXT_GATES if k in budget}, **q["validate"]}
        out.append(
            variant(
                recipe,
                q["name"],
                f"quantize.{q['name']}",
                f"{q['name']}/",
                precision(cast(QuantizeSection, q)),
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
        text = q["calibration"].get("text") if budgeted else None
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
                            "inputs": r["export"]["inputs"],
                            "shapes": r["validate"]["shapes"],
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
                    *((f"reports/quantize/{q['name']}.json",) if budgeted or q["method"] == "gguf" else ()),
                ),
                files=files,
            )
        )
    return steps


def _keyed(q: QuantizeSection, keys: tuple[str, ...]) -> dict[str, Any]:
    """The entry as its step reads it: static calibration reads no text (that is the budget's)."""
    out: dict[str, Any] = pick(q, keys)
    if q["method"] == "static":
        out["calibration"] = pick(q["calibration"], {"method", "samples", "npz"})
    return out


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnx

    q = cast(QuantizeSection, spec.params["quantize"])
    if spec.params.get("files"):
        return _each_file(ctx, spec, q)
    src = ctx.input(spec.params["input"])
    out = ctx.output(f"{q['name']}/model.onnx")
    if q["method"] == "gguf":
        return _gguf(ctx, spec, src, out, q)
    plan = _budgeted(ctx, spec, src, out, q) if q.get("budget") else None
    if plan is None:
        _quantize(ctx, spec, src, out, q, "")
    for extra in out.parent.glob("*.onnx.data"):
        extra.unlink()
    size_in, size_out = src.stat().st_size, out.stat().st_size
    model = onnx.load_model(str(out), load_external_data=False)
    quantized = sum(
        1
        for n in model.graph.node
        if n.op_type
        in (
            "MatMulInteger",
            "DynamicQuantizeMatMul",
            "QLinearMatMul",
            "MatMulNBits",
            "QAttention",
            "DynamicQuantizeLinear",
            "QuantizeLinear",
        )
    )
    summary = (
        f"{q['method']}: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB ({size_out / size_in:.0%}), "
        f"{quantized} quantized nodes"
    )
    from onnxbuild.steps.optimize import genai_beside

    if q["method"] in ("int4", "weight_only"):
        summary += (
            f", {bits_of(q)}-bit weights ({q['algorithm']}, block {q['block_size']}, "
            f"{'symmetric' if q['symmetric'] and q['algorithm'] == 'rtn' else 'asymmetric'}), "
            f"accuracy_level {q['accuracy_level']}"
        )
    kept = excluded(src, q) if q["keep"] else []
    if kept:
        summary += f", kept in full precision: {', '.join(kept)}"
    beside = genai_beside(ctx, spec.params["input"], q["name"])
    data: dict[str, Any] = {"bytes_in": size_in, "bytes_out": size_out, "quantized_nodes": quantized}
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
    return StepResult(summary=summary, data=data, extra_outputs=beside)


def _quantize(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection, where: str) -> None:
    try:
        if q["method"] == "dynamic":
            _dynamic(src, out, q)
        elif q["method"] == "static":
            _static(ctx, spec, src, out, q)
        else:
            _weight_only(src, out, q)
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
    return StepResult(
        summary=f"{q['method']}: {'; '.join(parts)} ({size_out / size_in:.0%})",
        data={"bytes_in": size_in, "bytes_out": size_out},
    )


def _dynamic(src: Path, out: Path, q: QuantizeSection) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(out),
        op_types_to_quantize=q["op_types"],
        per_channel=q["per_channel"],
        reduce_range=q["reduce_range"],
        weight_type=QuantType.QInt8 if q["weight_type"] == "int8" else QuantType.QUInt8,
        nodes_to_exclude=excluded(src, q) or None,
        # Needed on ORT-optimized models ("Unable to find data type for weight_name").
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def excluded(model: Any, q: QuantizeSection, *, each_must_match: bool = True) -> list[str]:
    """Node names left in full precision: ``exclude_nodes`` as given, and every MatMul/Gemm
    whose name holds one of ``keep`` (``lm_head`` matches ``/lm_head/MatMul``). A name that
    matches nothing is an error, except file by file in a multi-file model (the decoder's
    lm_head is in no encoder): :func:`_each_file` checks that each matches some file."""
    import onnx

    names = list(q["exclude_nodes"])
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load_model(str(model), load_external_data=False)
    # onnxruntime's quantizers take every "Attention" for its contrib op and rewrite ONNX's own
    # (opset 23) into a QAttention that cannot load: it stays float, the MatMuls around it do not
    names += [
        n.name
        for n in proto.graph.node
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx") and n.name not in names
    ]
    if q.get("keep"):
        weighted = [n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm", "Gather")]
        for k in q["keep"]:
            hits = [n for n in weighted if k in n]
            if not hits and each_must_match:
                raise StepError(
                    f"quantize.{q['name']}.keep: {k!r} is in no MatMul, Gemm or Gather node's name "
                    f"(names look like {', '.join(weighted[-3:])}); fix the name or drop it"
                )
            names += [n for n in hits if n not in names]
    return names


def bits_of(q: QuantizeSection) -> int:
    """The weight width of a weight-only method: ``int4`` is 4, ``weight_only`` says."""
    return 4 if q["method"] == "int4" else int(q["bits"])


def _gguf(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> StepResult:
    """The GGUF file's own blocks in the graph (onnxbuild/quant/gguf_exact.py), not re-quantized:
    the file computes what PyTorch computes on the dequantized GGUF, up to the activations'
    int8 rounding at accuracy_level 4. What cannot be carried exactly stays float and is named."""
    import onnx

    from onnxbuild.quant.gguf_exact import Carried, carry
    from onnxbuild.sources.huggingface import gguf_file

    ((_, source),) = spec.params["source"].items()
    path = gguf_file(source, ctx.recipe_dir)
    assert path is not None  # the source step, an input of this one, found the file
    model = onnx.load_model(str(src))
    try:
        model, carried = carry(model, path, accuracy_level=int(q["accuracy_level"]), embedding=q["embedding"])
    except StepError:
        raise
    except Exception as exc:
        raise StepError(f"quantize.{q['name']} (gguf) failed: {type(exc).__name__}: {str(exc)[:500]}") from None
    _bias_into_nbits(model)
    onnx.save_model(model, str(out))
    exact = [c for c in carried if c.exact]
    left = [c for c in carried if not c.exact]
    if not q["embedding"]:
        left.append(
            Carried(
                "token_embd.weight",
                "",
                "model.embed_tokens.weight",
                why_not="quantize.embedding is false: the embedding Gather stays float",
            )
        )
    report = {
        "gguf": path.name,
        "accuracy_level": int(q["accuracy_level"]),
        "carried": [
            {
                "gguf": c.gguf_name,
                "type": c.gguf_type,
                "onnx": c.onnx_name,
                "op": c.op,
                "bits": c.bits,
                "zero_points": c.zero_points,
            }
            for c in exact
        ],
        "not_carried": [
            {"gguf": c.gguf_name, "type": c.gguf_type, "onnx": c.onnx_name, "why": c.why_not} for c in left
        ],
    }
    ctx.output(f"reports/quantize/{q['name']}.json").write_text(pretty_json(report), encoding="utf-8")
    types = ", ".join(f"{t} {sum(1 for c in exact if c.gguf_type == t)}" for t in sorted({c.gguf_type for c in exact}))
    size_in, size_out = src.stat().st_size, out.stat().st_size
    summary = (
        f"gguf: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB, {len(exact)} GGUF tensors carried exactly "
        f"({types}), accuracy_level {q['accuracy_level']}"
    )
    if left:
        named = [f"{c.gguf_name or c.onnx_name} ({c.gguf_type or 'no GGUF tensor'}: {c.why_not})" for c in left]
        summary += f"; not carried (float): {', '.join(named[:5])}" + (
            f" and {len(named) - 5} more" if len(named) > 5 else ""
        )
    from onnxbuild.steps.optimize import genai_beside

    beside = genai_beside(ctx, spec.params["input"], q["name"])
    return StepResult(
        summary=summary,
        data={"bytes_in": size_in, "bytes_out": size_out, "carried": len(exact), "not_carried": len(left)},
        extra_outputs=beside,
    )


def _budgeted(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> PrecisionPlan:
    """The least-bytes per-layer plan that meets ``q['budget']`` (steps/budget.py), written."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from onnxbuild.steps import budget as b

    what = f"quantize.{q['name']}"
    cfg = cast(dict[str, Any], q["budget"])
    wanted = {k: float(cfg[k]) for k in b.METRICS if cfg.get(k) is not None}
    # planned within a margin of the budget on the calibration text, so that other text (the
    # validation's, a user's) stays within the budget itself: SmolLM2's plan for a 5% budget met
    # at 70% (+3.40% on 8 windows of the calibration text) measured +6.09% on the held-out text
    margin = float(cfg.get("margin", DEFAULT_MARGIN))
    target = {k: v * margin for k, v in wanted.items()}
    fallback = None if cfg.get("fallback") == "float" else 8
    model = onnx.load_model(str(src))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    windows, where = _calibration_windows(ctx, spec, q, session)
    feeds = [_prefill_feeds(session, row) for row in windows]
    first = session.get_outputs()[0].name
    reference = [np.asarray(session.run([first], f)[0])[0, :-1] for f in feeds]
    del session
    targets = [row[1:] for row in windows]
    names = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in excluded(model, q)]
    bits = bits_of(q)
    order = b.candidates(model, feeds, names, bits, q["block_size"], q["symmetric"], fallback)

    def build(k: int) -> Any:
        kept = [c.node for c in order[:k]]
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return _weight_only_proto(
            copy, {**q, "exclude_nodes": [*q["exclude_nodes"], *kept]}, keep_bits=(kept, fallback)
        )

    def evaluate(k: int) -> dict[str, float]:
        candidate = ort.InferenceSession(build(k).SerializeToString(), providers=["CPUExecutionProvider"])
        logits = [np.asarray(candidate.run([first], f)[0])[0, :-1] for f in feeds]
        return b.figures(reference, logits, targets)

    note = f" ({margin:g} of the budget, budget.margin)" if margin != 1 else ""
    k, found, tried = b.search(order, evaluate, target, what, note)
    final = build(k)
    _bias_into_nbits(final)
    onnx.save_model(final, str(out))
    plan: PrecisionPlan = {
        "budget": wanted,
        "margin": margin,
        "calibration": where,
        "matmuls": len(order),
        "bits": bits,
        "kept": [{"node": c.node, "bits": fallback, "sensitivity": c.sensitivity} for c in order[:k]],
        "figures": found,
        "tried": tried,
    }
    ctx.output(f"reports/quantize/{q['name']}.json").write_text(pretty_json(plan), encoding="utf-8")
    return plan


def _calibration_windows(ctx: StepContext, spec: StepSpec, q: QuantizeSection, session: Any) -> tuple[Any, str]:
    """[windows, window] token ids: calibration.text through the model's tokenizer, or seeded
    random ids (a model without a tokenizer: a random-init one)."""
    import numpy as np

    cal = q["calibration"]
    window, count = int(cal["window"]), int(cal["samples"])
    if cal.get("text"):
        from onnxbuild.sources.torchmodel import load_tokenizer
        from onnxbuild.steps.base import read_source_record

        path = ctx.recipe_dir / str(cal["text"])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StepError(
                f"quantize.{q['name']}.calibration.text: cannot read {path} ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        tokenizer = load_tokenizer(
            spec.params["source"], read_source_record(ctx), ctx.recipe_dir, key=f"quantize.{q['name']}.calibration.text"
        )
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        n = min(len(ids) // window, count)
        if n == 0:
            raise StepError(
                f"quantize.{q['name']}.calibration.text: {cal['text']} is {len(ids)} tokens long, "
                f"shorter than one window of {window}; give more text or a smaller calibration.window"
            )
        return ids[: n * window].reshape(n, window), f"{n} windows of {window} tokens from {cal['text']}"
    vocab = next((int(o.shape[-1]) for o in session.get_outputs()[:1] if isinstance(o.shape[-1], int)), 1000)
    rng = np.random.default_rng(0)
    return rng.integers(
        0, vocab, size=(count, window), dtype=np.int64
    ), f"{count} windows of {window} seeded random token ids (no calibration.text)"


def _prefill_feeds(session: Any, ids: Any) -> dict[str, Any]:
    """One window as a prefill: its ids, a mask of ones, positions from 0 and every past empty."""
    import numpy as np

    feeds: dict[str, Any] = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = ids[None, :]
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, len(ids)), dtype=np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(len(ids), dtype=np.int64)[None, :]
        elif i.name.startswith(PAST):
            feeds[i.name] = np.zeros(
                [1 if j == 0 else 0 if j == 2 else d for j, d in enumerate(i.shape)], dtype=np.float32
            )
        else:
            raise StepError(f"an accuracy budget runs decoders on text windows; this model also takes {i.name!r}")
    return feeds


def _weight_only(src: Path, out: Path, q: QuantizeSection) -> None:
    import onnx

    model = _weight_only_proto(onnx.load_model(str(src)), q)
    _bias_into_nbits(model)
    onnx.save_model(model, str(out))


def _weight_only_proto(model: Any, q: QuantizeSection, keep_bits: tuple[list[str], int | None] = ([], None)) -> Any:
    """Weights in ``bits`` per value (MatMulNBits), one scale (and zero point unless
    symmetric) per block of ``block_size`` along the input axis; activations stay float and,
    at accuracy_level 4, are quantized per block of the same size inside the kernel.

    ``algorithm``: ``rtn`` rounds each weight to its block's grid (min/max); ``hqq`` (half-
    quadratic quantization) searches each block's scale and float zero point to minimise the
    weights' error, with no data. A decoder's 8-bit weights at accuracy_level 4 run
    MLAS's int8 kernel (SmolLM2-sized MatMul: 17 us at one token against fp32's 30, where
    accuracy_level 0 took 1.3-14 ms, the slow path the issue measured)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    bits = bits_of(q)
    # GatherBlockQuantized wants the embedding blocked along the hidden axis (1), the
    # MatMuls' weights along their input axis (0)
    ops = (
        {"op_types_to_quantize": ("MatMul", "Gather"), "quant_axes": (("MatMul", 0), ("Gather", 1))}
        if q["embedding"]
        else {}
    )
    algo = HQQWeightOnlyQuantConfig(block_size=q["block_size"], bits=bits, **ops) if q["algorithm"] == "hqq" else None
    quant = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=q["block_size"],
        is_symmetric=q["symmetric"],
        accuracy_level=q["accuracy_level"] or None,
        nodes_to_exclude=excluded(model, q) or None,
        algo_config=algo,
        **ops,
    )
    quant.process()
    if algo is not None:
        if q["accuracy_level"]:  # the HQQ writer leaves the compute type unset
            for node in quant.model.model.graph.node:
                if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
                    node.attribute.append(onnx.helper.make_attribute("accuracy_level", int(q["accuracy_level"])))
        # HQQ's float zero points have no prepacked kernel in ONNX Runtime's CPU MatMulNBits (SmolLM2:
        # 736 ms a token against 17.5 with uint8 zero points): the same weights, exactly, as whole
        # zero points and a float offset on the activation's block sums (onnxbuild/quant/split_zero.py)
        from onnxbuild.quant.split_zero import split_float_zero_points

        split_float_zero_points(quant.model.model)
    kept, fallback = keep_bits
    if kept and fallback is not None:  # the budget's kept MatMuls, at 8 bits
        again = MatMulNBitsQuantizer(
            quant.model.model,
            bits=fallback,
            block_size=q["block_size"],
            is_symmetric=False,
            accuracy_level=q["accuracy_level"] or None,
            nodes_to_include=kept,
        )
        again.process()
        return again.model.model
    return quant.model.model


def _bias_into_nbits(model: Any) -> None:
    """A constant bias added right after a MatMulNBits goes into its optional ``bias`` input:
    one kernel instead of two, which at one token per step is a measurable share (Qwen2's
    q/k/v biases: 12 Add nodes per decode step)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    consumers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    for add in list(model.graph.node):
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        first, second = add.input
        mm, bias = (producer.get(first), second) if second in inits else (producer.get(second), first)
        if (
            mm is None
            or mm.op_type != "MatMulNBits"
            or bias not in inits
            or consumers.get(mm.output[0]) != 1
            or mm.output[0] in outputs
        ):
            continue
        n_out = next(a.i for a in mm.attribute if a.name == "N")
        if (
            list(inits[bias].dims) != [n_out]
            or len(mm.input) > 5
            or numpy_helper.to_array(inits[bias]).dtype.name != "float32"
        ):
            continue
        mm.input.extend([""] * (5 - len(mm.input)) + [bias])
        mm.output[0] = add.output[0]
        model.graph.node.remove(add)


def _static(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> None:
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    cal = q["calibration"]
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    pasts = {
        i.name: [d if isinstance(d, int) else 0 for d in i.shape]
        for i in session.get_inputs()
        if i.name.startswith(PAST)
    }
    del session
    batches: list[dict[str, Any]]
    if cal["npz"]:
        path = ctx.recipe_dir / cal["npz"]
        try:
            data = np.load(path)
        except OSError as exc:
            raise StepError(f"quantize.{q['name']}.calibration.npz: cannot read {cal['npz']}: {exc}") from None
        missing = [n for n in names if n not in data and n not in pasts]
        if missing:
            raise StepError(
                f"quantize.{q['name']}.calibration.npz: {cal['npz']} lacks arrays for inputs {missing} "
                f"(it has {sorted(data)})"
            )
        given = [n for n in names if n in data]
        count = len(data[given[0]])
        batches = [{n: data[n][i : i + 1] for n in given} for i in range(count)]
    else:
        from onnxbuild.sources.torchmodel import make_inputs

        specs = spec.params["inputs"]
        shapes = spec.params["shapes"]
        if cal["method"] != "minmax":
            # onnxruntime's histogram calibrators stack each tensor over every sample, so all
            # samples take one shape: the largest (mixed shapes failed with numpy's
            # "inhomogeneous shape" ValueError)
            shapes = [max(shapes, key=lambda s: math.prod(v for v in s.values() if isinstance(v, int)))]
        vocab = spec.params.get("vocab_size")
        batches = [
            make_inputs(specs, shapes[i % len(shapes)], seed=1000 + i, vocab=vocab) for i in range(cal["samples"])
        ]
        batches = [{k: v for k, v in b.items() if k in names} for b in batches]
    # A decoder with a KV cache calibrates on prefills: each past an empty [batch, heads, 0, dim].
    for batch in batches:
        rows = next((len(v) for k, v in batch.items() if not k.startswith(PAST)), 1)
        for name, shape in pasts.items():
            batch.setdefault(
                name, np.zeros([rows if i == 0 else 0 if i == 2 else d for i, d in enumerate(shape)], dtype=np.float32)
            )

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.items = iter(batches)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.items, None)

    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    quantize_static(
        str(src),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=q["op_types"],
        per_channel=q["per_channel"],
        reduce_range=q["reduce_range"],
        activation_type=QuantType.QInt8 if q["activation_type"] == "int8" else QuantType.QUInt8,
        weight_type=QuantType.QInt8 if q["weight_type"] == "int8" else QuantType.QUInt8,
        nodes_to_exclude=excluded(src, q) or None,
        calibrate_method=methods[cal["method"]],
        extra_options={"DefaultTensorType": 1, "ActivationSymmetric": q["activation_type"] == "int8"},
    )
