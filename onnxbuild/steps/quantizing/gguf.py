"""A GGUF's own quantized blocks carried into the graph exactly (MatMulNBits and
GatherBlockQuantized), or at int8 compute.
"""

from __future__ import annotations

from pathlib import Path

from onnxbuild._util import pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import QuantizeSection
from onnxbuild.steps.base import StepContext, StepResult, StepSpec
from onnxbuild.steps.quantizing.nbits import bias_into_nbits


def from_gguf(ctx: StepContext, spec: StepSpec, src: Path, out: Path, q: QuantizeSection) -> StepResult:
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
    bias_into_nbits(model)
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
    from onnxbuild.steps.base import genai_beside

    beside = genai_beside(ctx, spec.params["input"], q["name"])
    return StepResult(
        summary=summary,
        data={"bytes_in": size_in, "bytes_out": size_out, "carried": len(exact), "not_carried": len(left)},
        extra_outputs=beside,
    )
