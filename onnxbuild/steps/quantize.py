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

from onnxbuild._util import pick
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.recipe.variants import vocab_size
from onnxbuild.sources.decoder import PAST_PREFIX as PAST
from onnxbuild.spec import Planning, StepInput
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

VERSION = 4
PACKAGES = ("onnxruntime", "onnx", "numpy")

# The recipe keys each method reads; the others keep their defaults but do nothing, so a
# review of a new variant shows only these.
COMMON_KEYS = ("name", "method", "from", "exclude_nodes", "keep", "validate")
METHOD_KEYS = {
    "dynamic": (*COMMON_KEYS, "per_channel", "reduce_range", "weight_type", "op_types"),
    "static": (*COMMON_KEYS, "per_channel", "reduce_range", "weight_type", "activation_type", "op_types", "calibration"),
    "int4": (*COMMON_KEYS, "block_size", "symmetric", "accuracy_level", "embedding"),
}


KEYED = {method: tuple(k for k in keys if k not in ("validate", "from")) for method, keys in METHOD_KEYS.items()}
"""What enters a quantize step's key: its method's keys, less ``validate:`` (the variant's
validate step reads it) and ``from`` (the input file it names is in the key already)."""

MEMORY = (3, 400)


def plan(p: Planning) -> list[StepSpec]:
    """One step per ``quantize`` entry, from the variant it names."""
    r = p.recipe.resolved
    by_name = {v.name: v for v in p.variants}
    steps = []
    for q in r.get("quantize", []):
        base = by_name["optimized"] if q["from"] == "optimized" else by_name["model"]
        # static int8 calibrates on seeded inputs of the validation shapes unless given an .npz
        seeded = q["method"] == "static" and not q["calibration"]["npz"] and p.recipe.torch_source
        steps.append(
            StepSpec(
                name=f"quantize.{q['name']}",
                kind="quantize",
                params={
                    "quantize": pick(q, KEYED[q["method"]]),
                    "input": base.path,
                    **({"files": list(base.files)} if base.files else {}),
                    **({"inputs": r["export"]["inputs"], "shapes": r["validate"]["shapes"], "vocab_size": vocab_size(p.recipe)} if seeded else {}),
                },
                deps=(base.step,),
                inputs=tuple(StepInput(base.step, f) for f in base.paths),
                outputs=tuple(f"{q['name']}/{Path(f).name}" for f in base.paths),
            )
        )
    return steps


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnx

    q = cast(QuantizeSection, spec.params["quantize"])
    if spec.params.get("files"):
        return _each_file(ctx, spec, q)
    src = ctx.input(spec.params["input"])
    out = ctx.output(f"{q['name']}/model.onnx")
    _quantize(ctx, spec, src, out, q, "")
    for extra in out.parent.glob("*.onnx.data"):
        extra.unlink()
    size_in, size_out = src.stat().st_size, out.stat().st_size
    model = onnx.load_model(str(out), load_external_data=False)
    quantized = sum(1 for n in model.graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul", "MatMulNBits", "QAttention", "DynamicQuantizeLinear", "QuantizeLinear"))
    summary = f"{q['method']}: {size_in / 1e6:.1f} MB -> {size_out / 1e6:.1f} MB ({size_out / size_in:.0%}), {quantized} quantized nodes"
    from onnxbuild.steps.optimize import genai_beside

    if q["method"] == "int4":
        summary += f", accuracy_level {q['accuracy_level']}"
    kept = excluded(src, q) if q["keep"] else []
    if kept:
        summary += f", kept in full precision: {', '.join(kept)}"
    beside = genai_beside(ctx, spec.params["input"], q["name"])
    return StepResult(summary=summary, data={"bytes_in": size_in, "bytes_out": size_out, "quantized_nodes": quantized}, extra_outputs=beside)


def _quantize(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection, where: str) -> None:
    try:
        if q["method"] == "dynamic":
            _dynamic(src, out, q)
        elif q["method"] == "static":
            _static(ctx, spec, src, out, q)
        else:
            _int4(src, out, q)
    except StepError:
        raise
    except Exception as exc:
        raise StepError(f"quantize.{q['name']} ({q['method']}) failed{where}: {type(exc).__name__}: {str(exc)[:500]}") from None


def _each_file(ctx: StepContext, spec: StepSpec, q: QuantizeSection) -> StepResult:
    """A multi-file model (an encoder and a decoder): each file quantized the same way."""
    parts = []
    size_in = size_out = 0
    files = spec.params["files"]
    kept = {name: excluded(ctx.input(name), q, each_must_match=False) for name in files}
    for k in q["keep"]:
        if not any(k in node for names in kept.values() for node in names):
            raise StepError(f"quantize.{q['name']}.keep: {k!r} is in no MatMul, Gemm or Gather node's name in {', '.join(Path(f).name for f in files)}; fix the name or drop it")
    for name in files:
        src, out = ctx.input(name), ctx.output(f"{q['name']}/{Path(name).name}")
        _quantize(ctx, spec, src, out, {**q, "keep": [], "exclude_nodes": kept[name]}, f" on {Path(name).name}")
        size_in, size_out = size_in + src.stat().st_size, size_out + out.stat().st_size
        parts.append(f"{Path(name).name} {src.stat().st_size / 1e6:.1f} -> {out.stat().st_size / 1e6:.1f} MB")
    for extra in ctx.output(q["name"]).glob("*.onnx.data"):
        extra.unlink()
    return StepResult(summary=f"{q['method']}: {'; '.join(parts)} ({size_out / size_in:.0%})", data={"bytes_in": size_in, "bytes_out": size_out})


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
    names += [n.name for n in proto.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx") and n.name not in names]
    if q.get("keep"):
        weighted = [n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm", "Gather")]
        for k in q["keep"]:
            hits = [n for n in weighted if k in n]
            if not hits and each_must_match:
                raise StepError(f"quantize.{q['name']}.keep: {k!r} is in no MatMul, Gemm or Gather node's name (names look like {', '.join(weighted[-3:])}); fix the name or drop it")
            names += [n for n in hits if n not in names]
    return names


def _int4(src: Path, out: Path, q: QuantizeSection) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load_model(str(src))
    # GatherBlockQuantized wants the embedding blocked along the hidden axis (1), the
    # MatMuls' weights along their input axis (0)
    ops = {"op_types_to_quantize": ("MatMul", "Gather"), "quant_axes": (("MatMul", 0), ("Gather", 1))} if q["embedding"] else {}
    quant = MatMulNBitsQuantizer(
        model, bits=4, block_size=q["block_size"], is_symmetric=q["symmetric"], accuracy_level=q["accuracy_level"] or None, nodes_to_exclude=excluded(model, q) or None, **ops,
    )
    quant.process()
    _bias_into_nbits(quant.model.model)
    quant.model.save_model_to_file(str(out), use_external_data_format=False)


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
        if mm is None or mm.op_type != "MatMulNBits" or bias not in inits or consumers.get(mm.output[0]) != 1 or mm.output[0] in outputs:
            continue
        n_out = next(a.i for a in mm.attribute if a.name == "N")
        if list(inits[bias].dims) != [n_out] or len(mm.input) > 5 or numpy_helper.to_array(inits[bias]).dtype.name != "float32":
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
    pasts = {i.name: [d if isinstance(d, int) else 0 for d in i.shape] for i in session.get_inputs() if i.name.startswith(PAST)}
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
            raise StepError(f"quantize.{q['name']}.calibration.npz: {cal['npz']} lacks arrays for inputs {missing} (it has {sorted(data)})")
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
        batches = [make_inputs(specs, shapes[i % len(shapes)], seed=1000 + i, vocab=vocab) for i in range(cal["samples"])]
        batches = [{k: v for k, v in b.items() if k in names} for b in batches]
    # A decoder with a KV cache calibrates on prefills: each past an empty [batch, heads, 0, dim].
    for batch in batches:
        rows = next((len(v) for k, v in batch.items() if not k.startswith(PAST)), 1)
        for name, shape in pasts.items():
            batch.setdefault(name, np.zeros([rows if i == 0 else 0 if i == 2 else d for i, d in enumerate(shape)], dtype=np.float32))

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.items = iter(batches)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.items, None)

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy, "percentile": CalibrationMethod.Percentile}
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
