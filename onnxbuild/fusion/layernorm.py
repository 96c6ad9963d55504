"""SkipLayerNormalization split back into ``Sum`` + ``LayerNormalization`` for CPU targets.

ONNX Runtime's CPU kernel for SkipLayerNormalization (the LayerNorm one; the RMSNorm one,
SkipSimplifiedLayerNormalization, is fine) is slow: 24 of them on a [1, 128, 768] input take
5.1 ms, where the same residual add and LayerNormalization take 0.83-1.1 ms; at one token
0.09 ms against 0.03 (onnxruntime 1.31, 2 threads, Intel Xeon with AMX and AMD EPYC alike).
In GPT-2 int8 that was 17% of a 128-token prefill. CUDA's fused kernel is the faster one
there, so the split is for recipes that run on CPU only (optimize.skip_layer_norm: auto).

``Sum``, not ``Add``: ORT's session-time SkipLayerNormFusion (level extended, on by default)
matches Add + LayerNormalization and would fuse the pair straight back into the slow kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxbuild.fusion.passes import Pass, set_nodes

if TYPE_CHECKING:
    import onnx

MIN_OPSET = 17
"""LayerNormalization entered the ONNX domain at opset 17."""
PASS = Pass(
    "split-skip-layer-norm",
    requires=f"ONNX opset >= {MIN_OPSET} (LayerNormalization); any SkipLayerNormalization (com.microsoft)",
    guarantees="no SkipLayerNormalization is left: each is Sum (with its bias Add) + LayerNormalization",
)


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def split_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Rewrite every SkipLayerNormalization of ``model`` in place; returns how many.

    Inputs (x, skip, gamma, beta?, bias?) become Sum(x [+ bias], skip) -> LayerNormalization
    (gamma, beta) over the last axis; the sum output (the next residual) keeps its name, so
    the rest of the graph is untouched. A model below opset 17 is left as it is (0)."""
    from onnx import helper

    if default_opset(model) < MIN_OPSET:
        return 0
    graph = model.graph
    nodes = []
    count = 0
    for node in graph.node:
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        ins = list(node.input) + [""] * (5 - len(node.input))
        outs = list(node.output) + [""] * (4 - len(node.output))
        x, skip, gamma, beta, bias = ins[:5]
        y, mean, inv_std, total = outs[:4]
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)
        base = node.name or f"SkipLayerNorm_{count}"
        total = total or f"{base}/sum_output"
        if bias:
            # its own Add right after the projection's MatMul, where onnxruntime folds it into
            # the (quantized) MatMul; a three-input Sum measured 1.5 ms against 0.3 (24 of them)
            biased = f"{base}/biased"
            nodes.append(helper.make_node("Add", [x, bias], [biased], name=f"{base}/BiasAdd"))
            x = biased
        nodes.append(helper.make_node("Sum", [x, skip], [total], name=f"{base}/Sum"))
        ln_outs = [y, mean, inv_std]
        while ln_outs and not ln_outs[-1]:
            ln_outs.pop()
        ln_ins = [total, gamma] + ([beta] if beta else [])
        nodes.append(
            helper.make_node("LayerNormalization", ln_ins, ln_outs, name=f"{base}/LayerNorm", axis=-1, epsilon=eps)
        )
        count += 1
    if count:
        set_nodes(graph, nodes)
    return count
