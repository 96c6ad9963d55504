"""int8 with activations quantized at run time (dynamic) or from calibrated ranges (static,
QDQ), and the nodes a recipe keeps in float.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.sources.decoder import PAST_PREFIX as PAST
from onnxbuild.steps.base import StepContext, StepSpec

if TYPE_CHECKING:
    import numpy as np
    import onnx
    from numpy.typing import NDArray


def dynamic(src: Path, out: Path, q: QuantizeSection) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from onnxbuild.quant.aliases import fold_weight_aliases, weight_aliases

    model: str | onnx.ModelProto = str(src)
    proto = onnx.load_model(str(src), load_external_data=False)
    graph = proto.graph
    if weight_aliases(graph):
        model = onnx.load_model(str(src))  # a shared weight's later calls: quantized too, not left float
        fold_weight_aliases(model)
        graph = model.graph
    # a Conv whose weight is computed (wav2vec2's weight-normed positional conv: g * v / |v|)
    # stays float: onnxruntime's ConvInteger takes only an initializer as its weight
    constants = {t.name for t in graph.initializer}
    computed = [n.name for n in graph.node if n.op_type == "Conv" and n.input[1] not in constants]
    quantize_dynamic(
        model,
        str(out),
        op_types_to_quantize=q["op_types"],
        per_channel=q["per_channel"],
        reduce_range=q["reduce_range"],
        weight_type=QuantType.QInt8 if q["weight_type"] == "int8" else QuantType.QUInt8,
        nodes_to_exclude=[*excluded(proto, q), *computed] or None,
        # Needed on ORT-optimized models ("Unable to find data type for weight_name").
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def excluded(model: onnx.ModelProto | Path, q: QuantizeSection, *, each_must_match: bool = True) -> list[str]:
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


def static(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> None:
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
    batches: list[dict[str, NDArray[np.generic]]]
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

        def get_next(self) -> dict[str, NDArray[np.generic]] | None:
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
