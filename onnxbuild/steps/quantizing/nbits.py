"""Weight-only MatMulNBits files: 8 or 4 bits per weight in blocks, round-to-nearest or HQQ,
with the bias folded in.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.quant.aliases import fold_weight_aliases
from onnxbuild.quant.experts import experts_into_blocks
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.steps.exporting.files import PROTOBUF_LIMIT, save_with_data
from onnxbuild.steps.quantizing.int8 import excluded

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import onnx
    from numpy.typing import NDArray


def bits_of(q: QuantizeSection) -> int:
    """The weight width of a weight-only method: ``int4`` is 4, ``weight_only`` says."""
    return 4 if q["method"] == "int4" else int(q["bits"])


def streamable(src: Path, q: QuantizeSection) -> bool:
    """Quantized one MatMul at a time (quant/streamed.py): weight-only, the weights in external
    data (a model over 2 GB), the embedding left float and no budget (those need the whole graph)."""
    return (
        q["method"] in ("int4", "weight_only")
        and not q["embedding"]
        and not q.get("budget")
        and src.with_name(f"{src.name}.data").is_file()
    )


def weight_only(src: Path, out: Path, q: QuantizeSection) -> None:
    import onnx

    if streamable(src, q):
        from onnxbuild.quant.streamed import quantize

        skip = set(excluded(src, q))
        quantize(src, out, skip, one_matmul({**q, "keep": [], "exclude_nodes": []}))
        model = onnx.load_model(str(out), load_external_data=False)
        if bias_into_nbits(model):
            onnx.save_model(model, str(out))
        return
    model = onnx.load_model(str(src))
    fold_weight_aliases(model)
    model = weight_only_proto(model, q)
    bias_into_nbits(model)
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    if weights > PROTOBUF_LIMIT * 0.9:  # 8-bit weights of a 1B+ model: over protobuf's 2 GB
        save_with_data(model, out)
        return
    onnx.save_model(model, str(out))


def one_matmul(q: QuantizeSection) -> Callable[[onnx.NodeProto, NDArray[np.generic]], onnx.ModelProto]:
    """How a file quantized one MatMul at a time (quant/streamed.py) quantizes each: the
    quantizer's round-to-nearest straight from its kernel (``rounded``), anything else
    (HQQ) through the quantizer on a one-node model; the same nodes and bytes either way."""
    from onnxbuild.quant.streamed import alone, rounded

    def one(node: onnx.NodeProto, array: NDArray[np.generic]) -> onnx.ModelProto:
        if q["algorithm"] == "rtn" and not q["embedding"]:
            direct = rounded(node, array, bits_of(q), q["block_size"], q["symmetric"], q["accuracy_level"])
            if direct is not None:
                return direct
        return weight_only_proto(alone(node, array), q)

    return one


def weight_only_proto(
    model: onnx.ModelProto, q: QuantizeSection, keep_bits: tuple[list[str], int | None] = ([], None)
) -> onnx.ModelProto:
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
    # a mixture of experts' tables are Gathers, not MatMuls: the quantizer above leaves them float
    experts_into_blocks(quant.model.model, bits, q["block_size"], q["symmetric"], excluded(model, q))
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
        mixed: onnx.ModelProto = again.model.model  # onnxruntime is untyped: its ONNXModel wraps the proto
        return mixed
    quantized: onnx.ModelProto = quant.model.model
    return quantized


def bias_into_nbits(model: onnx.ModelProto) -> int:
    """A constant bias added right after a MatMulNBits goes into its optional ``bias`` input:
    one kernel instead of two, which at one token per step is a measurable share (Qwen2's
    q/k/v biases: 12 Add nodes per decode step)."""
    from onnx import TensorProto

    moved = 0
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
        if list(inits[bias].dims) != [n_out] or len(mm.input) > 5 or inits[bias].data_type != TensorProto.FLOAT:
            continue
        mm.input.extend([""] * (5 - len(mm.input)) + [bias])
        mm.output[0] = add.output[0]
        model.graph.node.remove(add)
        moved += 1
    return moved
