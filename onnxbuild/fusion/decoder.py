"""A fused decoder graph for the Llama family, written from the model's weights.

Per layer: SimplifiedLayerNormalization (first) or SkipSimplifiedLayerNormalization (the
residual add fused in), one MatMul for packed Q, K and V (plus its bias for Qwen2, unless all zero), ONNX's
RotaryEmbedding on Q and K at the input's position_ids and ONNX's Attention (opset 23) with
the mask built once from attention_mask (additive, masked keys at ``MASKED``) and the cache
in the ``[batch, kv_heads, past_sequence, head_dim]`` layout the export uses, the output
projection, and the gate, up (activation between) and down MatMuls. The inputs and outputs are
copied from the export, so validation and generation feed it exactly as they feed the
export. Node names follow ``/model/layers.{i}/...`` and ``/lm_head/MatMul`` so that a
quantize variant can keep chosen layers in higher precision by name.

One module (~1015 lines): one builder writes every layer and the model around it, sharing the
names, the mask and the cache layout; what differs between the families (FAMILIES below: Qwen2's
biases, Qwen3's q/k norms, Phi-3's packed weights, Gemma's scaled embedding, GPT-2's own layer,
a sliding layer's windowed attention) is a parameter of it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import BinaryIO

    import numpy as np
    import onnx
    import torch
    from numpy.typing import NDArray

from onnxbuild.errors import StepError
from onnxbuild.recipe.families import FUSED_DECODERS

# model_type -> what differs from Llama
FAMILIES = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "phi3": {"packed": True},
    "gemma": {"gemma": True},
    "gemma2": {"gemma": True, "sandwich": True},
    "gpt2": {"gpt2": True},
}
assert tuple(FAMILIES) == FUSED_DECODERS, "name a new family in onnxbuild/recipe/families.py too"
MS = "com.microsoft"

MASKED = -60.0
"""What a masked key adds to its attention score, where PyTorch adds the float minimum. ONNX
Runtime's CPU softmax clamps exp() at -88, so a minimum (or -inf, or a bool) mask leaves every
masked weight at e^-88, a denormal, and the probabilities x V products on those rows ran at
denormal speed in any session that does not flush denormals (ORT's default, onnxruntime-genai's):
llama-125m's 12 Attention nodes at a 128-token prefill took 8.0 ms with the bool mask, 4.6 with
this one (4.5 with denormals flushed). e^-60 is a normal float; a masked key weighs e^-60 (1e-26)
of the best visible key's weight unless it scores more than that key, and would need a score 44
above it to reach fp32's resolution (1e-7)."""


@dataclass(frozen=True)
class Built:
    """A fused decoder graph and what went into it (fused-op counts for optimize.json)."""

    model: onnx.ModelProto
    fused_ops: dict[str, int]
    family: str


def supported(model_type: str) -> bool:
    return model_type in FAMILIES


EXTERNAL_MIN = 1024
"""Weights this size or larger go to the external data file, when there is one."""
EXTERNAL_ALIGN = 4096


def build(
    model: Any,
    exported: onnx.ModelProto,
    data: BinaryIO | None = None,
    location: str = "",
    quantize: Quantize | None = None,
) -> Built:
    """The fused graph of ``model`` (a transformers causal LM in float32) with the signature of
    ``exported`` (the export's ModelProto, read without its weights); its weights written into
    ``data`` (the file ``location`` beside the model) where it is given (see :class:`Graph`),
    each MatMul's quantized by ``quantize`` as it is written where that is given."""
    # model stays Any: its layers are reached by attribute (model.model.layers[i].self_attn...),
    # which torch types as Tensor | Module, and its config's fields vary by family
    import numpy as np
    import torch

    config = model.config
    kind = str(config.model_type)
    if kind not in FAMILIES:
        raise StepError(
            f"optimize.decoder: fused: no fused graph for model_type {kind!r} (supported: {', '.join(FAMILIES)}); "
            "use optimize.decoder: export"
        )
    family = FAMILIES[kind]
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    # Gemma 2 names its activation hidden_activation (hidden_act is None there)
    act = str(getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "silu")
    if act not in ("silu", "gelu_pytorch_tanh", "gelu"):
        raise StepError(
            f"optimize.decoder: fused: activation {act!r} of {kind} has no fused graph here; "
            "use optimize.decoder: export"
        )
    names = {v.name for v in exported.graph.input}
    unknown = (
        names
        - {"input_ids", "attention_mask", "position_ids"}
        - {f"past_key_values.{i}.{kv}" for i in range(config.num_hidden_layers) for kv in ("key", "value")}
    )
    if unknown or "attention_mask" not in names or "past_key_values.0.key" not in names:
        raise StepError(
            "optimize.decoder: fused needs an export with export.with_past: true and inputs input_ids, "
            f"attention_mask, past_key_values.*; this one has {sorted(names)}"
        )

    g = Graph(data, location, quantize)
    weight, node, inits = g.weight, g.node, g.inits
    if family.get("gpt2"):
        return _gpt2(model, exported, g, heads, head_dim)
    inner = model.model

    def norm_weight(module: _Weighted) -> NDArray[np.generic]:
        w = module.weight.detach().float().numpy()
        return w + 1.0 if family.get("gemma") else w

    def eps(module: object) -> float:
        return float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))

    # embeddings; Gemma scales them by sqrt(hidden) (applied after the lookup, since lm_head may share the table)
    embed = inner.embed_tokens.weight.detach().float().numpy()
    # A tied table written once, where the weights go to external data (a 1B model's: 1.05 GB of
    # 4.94): lm_head's [hidden, vocab] matrix, which the lookup gathers along its second axis.
    # Smaller graphs keep the two tables, as the quantizers that treat the embedding as one
    # (its own 4- or 8-bit table, GGUF-exact) expect.
    head: str | None = None
    if data is not None and bool(getattr(config, "tie_word_embeddings", False)):
        head = weight("lm_head.weight", embed.T)
        del embed
        (columns,) = node(
            "Gather", [head, "input_ids"], ["/model/embed_tokens/columns"], "/model/embed_tokens/Gather", axis=1
        )
        (hidden,) = node(
            "Transpose", [columns], ["/model/embed_tokens/output"], "/model/embed_tokens/Transpose", perm=[1, 2, 0]
        )
    else:
        (hidden,) = node(
            "Gather",
            [weight("model.embed_tokens.weight", embed), "input_ids"],
            ["/model/embed_tokens/output"],
            "/model/embed_tokens/Gather",
        )
        del embed
    if family.get("gemma"):
        scale = weight("model.embed_scale", np.array(float(config.hidden_size) ** 0.5, dtype=np.float32))
        (hidden,) = node("Mul", [hidden, scale], ["/model/embed_tokens/scaled"], "/model/embed_tokens/Mul")

    # what attention needs besides Q, K, V: who sees whom, and the rotary tables
    visible = _visible(g)
    masks: dict[int, str] = {}  # window (-1: none) -> its additive mask
    positions = int(getattr(config, "max_position_embeddings", 2048))
    with torch.no_grad():
        probe = torch.zeros(1, 1, head_dim, dtype=torch.float32)
        cos, sin = inner.rotary_emb(probe, torch.arange(positions, dtype=torch.int64)[None, :])
    rotary = cos.shape[-1] // 2
    cos_cache = weight("model.rotary.cos_cache", cos[0, :, :rotary].numpy())
    sin_cache = weight("model.rotary.sin_cache", sin[0, :, :rotary].numpy())

    residual: str | None = None
    fused = {
        "Attention": 0,
        "RotaryEmbedding": 0,
        "SkipSimplifiedLayerNormalization": 0,
        "SimplifiedLayerNormalization": 0,
    }
    for i, layer in enumerate(inner.layers):
        p = f"/model/layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        x, residual = _norm(
            node,
            weight,
            fused,
            f"{p}/input_layernorm",
            hidden,
            residual,
            norm_weight(layer.input_layernorm),
            eps(layer.input_layernorm),
            f"model.layers.{i}.input_layernorm.weight",
        )
        if family.get("packed"):
            qkv_w = _linear_t(attn.qkv_proj)
        else:
            qkv_w = np.concatenate([_linear_t(attn.q_proj), _linear_t(attn.k_proj), _linear_t(attn.v_proj)], axis=1)
        (qkv,) = node(
            "MatMul",
            [x, weight(f"model.layers.{i}.attn.qkv_proj.weight", qkv_w)],
            [f"{p}/attn/qkv_proj/output"],
            f"{p}/attn/qkv_proj/MatMul",
        )
        bias = (
            np.concatenate(
                [
                    attn.q_proj.bias.detach().float().numpy(),
                    attn.k_proj.bias.detach().float().numpy(),
                    attn.v_proj.bias.detach().float().numpy(),
                ]
            )
            if family.get("qkv_bias")
            else None
        )
        # an all-zero bias (transformers initialises biases to zero: a random-init Qwen2) adds
        # nothing and costs a pass over Q, K and V: left out, as the model builder leaves it out
        if bias is not None and bias.any():
            (qkv,) = node(
                "Add",
                [qkv, weight(f"model.layers.{i}.attn.qkv_proj.bias", bias)],
                [f"{p}/attn/qkv_proj/biased"],
                f"{p}/attn/qkv_proj/Add",
            )
        q, k, v = node(
            "Split",
            [
                qkv,
                constant(
                    inits,
                    f"model.qkv_split.{heads}.{kv_heads}",
                    [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim],
                ),
            ],
            [f"{p}/attn/q", f"{p}/attn/k", f"{p}/attn/v"],
            f"{p}/attn/Split",
            axis=-1,
        )
        if family.get("qk_norm"):  # Qwen3 normalises each head of Q and K before the rotary embedding
            q = _head_norm(
                node,
                weight,
                inits,
                f"{p}/attn/q_norm",
                q,
                heads,
                head_dim,
                norm_weight(attn.q_norm),
                eps(attn.q_norm),
                f"model.layers.{i}.attn.q_norm.weight",
            )
            k = _head_norm(
                node,
                weight,
                inits,
                f"{p}/attn/k_norm",
                k,
                kv_heads,
                head_dim,
                norm_weight(attn.k_norm),
                eps(attn.k_norm),
                f"model.layers.{i}.attn.k_norm.weight",
            )
        # the rotation at each token's own position_ids, so a left-padded row turns as PyTorch turns it
        rotate = {"rotary_embedding_dim": 2 * rotary} if 2 * rotary != head_dim else {}
        (q,) = node(
            "RotaryEmbedding",
            [q, cos_cache, sin_cache, "position_ids"],
            [f"{p}/attn/q_rot"],
            f"{p}/attn/q_rotary",
            num_heads=heads,
            interleaved=0,
            **rotate,
        )
        (k,) = node(
            "RotaryEmbedding",
            [k, cos_cache, sin_cache, "position_ids"],
            [f"{p}/attn/k_rot"],
            f"{p}/attn/k_rotary",
            num_heads=kv_heads,
            interleaved=0,
            **rotate,
        )
        fused["RotaryEmbedding"] += 2
        window = _window(config, i)
        if window not in masks:  # once per window, shared by its layers
            masks[window] = _additive(g, visible if window < 0 else _windowed(g, visible, window), window)
        mask = masks[window]
        past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        present = [f"present.{i}.key", f"present.{i}.value"]
        # Gemma 2 caps the scores (cap * tanh(scores / cap)) before the softmax: Attention's
        # softcap, whose 0 (the others') is no cap
        attrs: _AttentionAttrs = {
            "q_num_heads": heads,
            "kv_num_heads": kv_heads,
            "scale": float(getattr(attn, "scaling", head_dim**-0.5)),
            "softcap": float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        }
        out = f"{p}/attn/output"
        whole = ("Attention", [q, k, v, mask, past_k, past_v], [out, *present], f"{p}/attn/Attention")
        if window < 0:
            node(*whole, **attrs)
        else:
            _sliding_attention(g, p, window, whole, heads, kv_heads, head_dim, attrs)
        fused["Attention"] += 1
        (o,) = node(
            "MatMul",
            [out, weight(f"model.layers.{i}.attn.o_proj.weight", _linear_t(attn.o_proj))],
            [f"{p}/attn/o_proj/output"],
            f"{p}/attn/o_proj/MatMul",
        )
        # Gemma 2's sandwich: the attention's and the MLP's outputs are normalised before their
        # residual adds, and the MLP's input by its own pre_feedforward norm
        if family.get("sandwich"):
            o = _plain_norm(node, weight, fused, f"{p}/post_attention_layernorm", o, layer.post_attention_layernorm, i)
        before_mlp = layer.pre_feedforward_layernorm if family.get("sandwich") else layer.post_attention_layernorm
        name = "pre_feedforward_layernorm" if family.get("sandwich") else "post_attention_layernorm"
        x, residual = _norm(
            node,
            weight,
            fused,
            f"{p}/{name}",
            o,
            residual,
            norm_weight(before_mlp),
            eps(before_mlp),
            f"model.layers.{i}.{name}.weight",
        )
        # gate and up stay two MatMuls: one packed [hidden, 2 x intermediate] MatMul and a Split
        # measured 3-5% slower at a 128-token prefill on 2 cores (MLAS tiles the wider N worse,
        # and the Split copies), and no faster at decode
        if family.get("packed"):
            gate_up = _linear_t(mlp.gate_up_proj)
            gate_w, up_w = np.split(gate_up, 2, axis=1)
        else:
            gate_w, up_w = _linear_t(mlp.gate_proj), _linear_t(mlp.up_proj)
        (gate,) = node(
            "MatMul",
            [x, weight(f"model.layers.{i}.mlp.gate_proj.weight", gate_w)],
            [f"{p}/mlp/gate"],
            f"{p}/mlp/gate_proj/MatMul",
        )
        (up,) = node(
            "MatMul",
            [x, weight(f"model.layers.{i}.mlp.up_proj.weight", up_w)],
            [f"{p}/mlp/up"],
            f"{p}/mlp/up_proj/MatMul",
        )
        if act == "silu":
            (sig,) = node("Sigmoid", [gate], [f"{p}/mlp/act/sigmoid"], f"{p}/mlp/act/Sigmoid")
            (activated,) = node("Mul", [gate, sig], [f"{p}/mlp/act/output"], f"{p}/mlp/act/Mul")
        else:
            (activated,) = node(
                "Gelu",
                [gate],
                [f"{p}/mlp/act/output"],
                f"{p}/mlp/act/Gelu",
                approximate="tanh" if act == "gelu_pytorch_tanh" else "none",
            )
        (prod,) = node("Mul", [activated, up], [f"{p}/mlp/act_up"], f"{p}/mlp/Mul")
        (hidden,) = node(
            "MatMul",
            [prod, weight(f"model.layers.{i}.mlp.down_proj.weight", _linear_t(mlp.down_proj))],
            [f"{p}/mlp/down_proj/output"],
            f"{p}/mlp/down_proj/MatMul",
        )
        if family.get("sandwich"):
            hidden = _plain_norm(
                node, weight, fused, f"{p}/post_feedforward_layernorm", hidden, layer.post_feedforward_layernorm, i
            )
    x, _ = _norm(
        node,
        weight,
        fused,
        "/model/norm",
        hidden,
        residual,
        norm_weight(inner.norm),
        eps(inner.norm),
        "model.norm.weight",
    )
    cap = getattr(config, "final_logit_softcapping", None)
    scores = "/lm_head/output" if cap else "logits"
    head = head or weight("lm_head.weight", _linear_t(model.lm_head))
    node("MatMul", [x, head], [scores], "/lm_head/MatMul")
    if cap:  # Gemma 2: logits = cap * tanh(logits / cap)
        limit = constant(inits, "final_logit_softcap", float(cap), "float32")
        (scaled,) = node("Div", [scores, limit], ["/lm_head/capped_in"], "/lm_head/softcap/Div")
        (bent,) = node("Tanh", [scaled], ["/lm_head/capped_tanh"], "/lm_head/softcap/Tanh")
        node("Mul", [bent, limit], ["logits"], "/lm_head/softcap/Mul")

    return Built(g.model(exported, opset=23), {k: v for k, v in fused.items() if v}, kind)


class _AttentionAttrs(TypedDict):
    """ONNX Attention's attributes as every layer of one model writes them."""

    q_num_heads: int
    kv_num_heads: int
    scale: float
    softcap: float


class _Weighted(Protocol):
    """A torch module with a weight (``nn.Linear``, an RMSNorm), as far as the graph reads it."""

    @property
    def weight(self) -> torch.Tensor: ...


class _LayerNorm(_Weighted, Protocol):
    @property
    def bias(self) -> torch.Tensor: ...

    @property
    def eps(self) -> float: ...


class _NodeFn(Protocol):
    def __call__(
        self, op: str, ins: list[str], outs: list[str], name: str, domain: str = "", **attrs: Any
    ) -> list[str]: ...


class _WeightFn(Protocol):
    def __call__(self, name: str, array: NDArray[np.generic]) -> str: ...


class Quantize(Protocol):
    """A MatMul node with its float weight [K, N] -> a model of the node(s) and tensors that replace it."""

    def __call__(self, node: onnx.NodeProto, array: NDArray[np.float32]) -> onnx.ModelProto: ...


class Graph:
    """Nodes and initializers of the graph being written. With ``data`` (an open file named
    ``location`` beside the model), each weight of EXTERNAL_MIN bytes or more goes straight
    into it and the graph keeps only where it lies: the weights are never all held as
    TensorProtos, nor serialized at once (a Llama-3.2-1B shape's fused graph: 4.9 GB).

    Each weight is written by a thread while the next is read and laid out (one write in
    flight: one weight more in memory), as both mostly wait outside Python: a 1B model's
    graph took 29.6 s with 14.5 s of numpy transposes, 7.4 s of writes and 4.5 s of reads."""

    def __init__(self, data: BinaryIO | None = None, location: str = "", quantize: Quantize | None = None) -> None:
        self.writing: Future[None] | None = None
        self.writer: ThreadPoolExecutor | None = None
        self.end = data.tell() if data is not None else 0
        """Where the data file ends once every write handed to the writer is done."""
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.data = data
        self.location = location
        self.quantize = quantize
        self.pending: dict[str, NDArray[np.float32]] = {}
        """With ``quantize``: matrices not written yet, until their first node says how."""
        self.placed: dict[str, tuple[int, tuple[int, ...]]] = {}

    def weight(self, name: str, array: NDArray[np.generic]) -> str:
        values = _laid_out(array)
        if self.quantize is not None and self.data is not None and values.ndim == 2 and values.nbytes >= EXTERNAL_MIN:
            self.pending[name] = values
            return name
        return self._write(name, values)

    def _write(self, name: str, values: NDArray[np.generic]) -> str:
        from onnx import TensorProto, helper, numpy_helper

        if self.data is None or values.nbytes < EXTERNAL_MIN:
            self.inits.append(numpy_helper.from_array(values, name))
            return name
        offset = self.end
        pad = -offset % EXTERNAL_ALIGN  # page-aligned, as onnx's own writer aligns them
        self.written()
        if self.writer is None:
            self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights")
        self.writing = self.writer.submit(_put, self.data, pad, values)
        self.end = offset + pad + values.nbytes
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(values.dtype), dims=values.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset + pad), ("length", values.nbytes)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        self.inits.append(tensor)
        self.placed[name] = (offset + pad, tuple(values.shape))
        return name

    def node(self, op: str, ins: list[str], outs: list[str], name: str, domain: str = "", **attrs: Any) -> list[str]:
        from onnx import helper

        made = helper.make_node(op, ins, outs, name=name, domain=domain, **attrs)
        if self.quantize is not None and op == "MatMul" and (ins[1] in self.pending or ins[1] in self.placed):
            self._quantized(made)
            return outs
        for i in ins:  # any other reader (a lookup) takes the matrix as it is
            if i in self.pending:
                self._write(i, self.pending.pop(i))
        self.nodes.append(made)
        return outs

    def _quantized(self, node: onnx.NodeProto) -> None:
        """``node`` (a MatMul) with its weight quantized, the new tensors written at once; a
        weight a lookup already wrote (a tied table) read back from the file for it."""
        import numpy as np
        from onnx import numpy_helper

        assert self.quantize is not None and self.data is not None
        weight = node.input[1]
        array = self.pending.pop(weight, None)
        if array is None:
            offset, shape = self.placed[weight]
            self.written()
            self.data.flush()
            array = np.fromfile(self.data.name, dtype=np.float32, count=int(np.prod(shape)), offset=offset)
            array = array.reshape(shape)
        result = self.quantize(node, array)
        del array
        for n in result.graph.node:
            copied = type(n)()
            copied.CopyFrom(n)
            self.nodes.append(copied)
        for t in result.graph.initializer:
            if t.name == weight:
                continue
            if any(i.name == t.name for i in self.inits):  # a block-sum table two MatMuls share
                continue
            self._write(t.name, numpy_helper.to_array(t))

    def written(self) -> None:
        """Every weight handed to the writer is in the file (a write's error raised here)."""
        if self.writing is not None:
            self.writing.result()
            self.writing = None

    def model(self, exported: onnx.ModelProto, opset: int = 20) -> onnx.ModelProto:
        """The graph as a model with the export's inputs and outputs, at ``opset`` or the export's."""
        from onnx import helper

        self.written()
        if self.writer is not None:
            self.writer.shutdown()

        graph = helper.make_graph(
            self.nodes, "fused_decoder", list(exported.graph.input), list(exported.graph.output), self.inits
        )
        opset = max(opset, *(o.version for o in exported.opset_import if o.domain in ("", "ai.onnx")))
        out = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)], producer_name="onnxbuild"
        )
        out.ir_version = 10  # what ONNX Runtime 1.20+ reads; the export's may be newer than this ORT takes
        # no onnx.checker: SimplifiedLayerNormalization is ONNX Runtime's, in the default domain
        return out


def _put(data: BinaryIO, pad: int, values: NDArray[np.generic]) -> None:
    data.write(b"\0" * pad)
    data.write(values.data.cast("B"))  # the array's own bytes: no copy


def _laid_out(array: NDArray[np.generic]) -> NDArray[np.float32]:
    """``array`` as float32 in C order. A transposed weight (an nn.Linear's [out, in] read as
    [in, out]) is copied by torch, whose two threads took 0.05 s for a 64 MB matrix where
    numpy's single-threaded copy took 0.13."""
    import numpy as np

    if array.dtype == np.float32 and array.flags.c_contiguous:
        return cast("NDArray[np.float32]", array)
    if array.ndim == 2 and array.dtype == np.float32 and array.T.flags.c_contiguous:
        import torch

        out: NDArray[np.float32] = torch.from_numpy(array.T).t().contiguous().numpy()
        return out
    return np.ascontiguousarray(array, dtype=np.float32)


def _linear_t(module: _Weighted) -> NDArray[np.generic]:
    out: NDArray[np.generic] = module.weight.detach().float().numpy().T  # numpy's stubs give .T no type on 3.10
    return out


def _visible(g: Graph) -> str:
    """The attention mask ONNX's Attention takes, bool [batch, 1, sequence, total_sequence]:
    query i (at position past + i) sees key j when ``attention_mask[b, j]`` is 1 and j <= past + i.
    Built once from the inputs, so a left-padded row attends as PyTorch's does."""
    from onnx import TensorProto

    one = constant(g.inits, "one_index", 1)
    (mshape,) = g.node("Shape", ["attention_mask"], ["/model/attn_mask/mask_shape"], "/model/attn_mask/MaskShape")
    (total,) = g.node("Gather", [mshape, one], ["/model/attn_mask/total"], "/model/attn_mask/Total", axis=0)
    (ishape,) = g.node("Shape", ["input_ids"], ["/model/attn_mask/ids_shape"], "/model/attn_mask/IdsShape")
    (new,) = g.node("Gather", [ishape, one], ["/model/attn_mask/new"], "/model/attn_mask/New", axis=0)
    (past,) = g.node("Sub", [total, new], ["/model/attn_mask/past"], "/model/attn_mask/Past")
    (keys,) = g.node(
        "Range", [constant(g.inits, "zero_i64", 0), total, one], ["/model/attn_mask/keys"], "/model/attn_mask/Keys"
    )
    (queries,) = g.node("Range", [past, total, one], ["/model/attn_mask/queries"], "/model/attn_mask/Queries")
    (column,) = g.node(
        "Unsqueeze",
        [queries, constant(g.inits, "last_axis", [-1])],
        ["/model/attn_mask/query_column"],
        "/model/attn_mask/QueryColumn",
    )
    (causal,) = g.node("LessOrEqual", [keys, column], ["/model/attn_mask/causal"], "/model/attn_mask/Causal")
    (kept,) = g.node(
        "Cast", ["attention_mask"], ["/model/attn_mask/kept"], "/model/attn_mask/Kept", to=TensorProto.BOOL
    )
    (rows,) = g.node(
        "Unsqueeze",
        [kept, constant(g.inits, "axes_1_2", [1, 2])],
        ["/model/attn_mask/kept_rows"],
        "/model/attn_mask/KeptRows",
    )
    (visible,) = g.node("And", [causal, rows], ["/model/attn_mask/visible"], "/model/attn_mask/Visible")
    return str(visible)


def _additive(g: Graph, visible: str, window: int) -> str:
    """``visible`` (bool) as the float mask Attention adds to its scores: 0 where a key is seen,
    ``MASKED`` where not (why not the minimum: ``MASKED``)."""
    seen, masked = constant(g.inits, "mask_seen", 0.0, "float32"), constant(g.inits, "mask_masked", MASKED, "float32")
    suffix = "" if window < 0 else str(window)
    (out,) = g.node(
        "Where", [visible, seen, masked], [f"/model/attn_mask/additive{suffix}"], f"/model/attn_mask/Additive{suffix}"
    )
    return str(out)


def _sliding_attention(
    g: Graph,
    p: str,
    window: int,
    whole: tuple[str, list[str], list[str], str],
    heads: int,
    kv_heads: int,
    head_dim: int,
    attrs: _AttentionAttrs,
) -> None:
    """A sliding layer's attention: over the whole past under its windowed mask while the past
    is short, over the window's keys alone once it is long.

    A query sees at most the last window-1 past keys, so once the past is long Attention reads
    only those (as the model builder's windowed GroupQueryAttention does): the present is the
    whole past + new (the cache layout every layer shares), concatenated apart, and Attention
    takes its last positions, their mask columns and Q in [batch, heads, sequence, head_dim].
    That costs a copy of the window's keys and values besides the present's; reading the whole
    past costs a pass over all of it, so the window pays once the past is several windows
    long (``past > 3 * window``; mistral-125m, window 64, one token after a random past of 1024:
    11.3 ms against 13.3), and below that the layer is the plain Attention (one token after
    1024 with a window of 4096: slicing always measured 16.9 ms against 15.3). An ``If`` picks
    per call; its own cost is under a microsecond."""
    from onnx import TensorProto, helper

    op, ins, outs, name = whole
    q, k, v, mask, past_k, past_v = ins
    out, present_k, present_v = outs
    long_past, start = _long_past(g, window)

    plain = Graph()
    plain.node(op, ins, [f"{out}/plain", f"{present_k}/plain", f"{present_v}/plain"], name, **attrs)

    recent = Graph()

    def to_heads(x: str, n: int, tag: str, ordered: str) -> str:
        """[batch, sequence, n * head_dim] as [batch, n, sequence, head_dim]."""
        (split,) = recent.node(
            "Reshape",
            [x, constant(g.inits, f"heads_shape.{n}.{head_dim}", [0, 0, n, head_dim])],
            [f"{p}/attn/{tag}_heads"],
            f"{p}/attn/{tag}_heads/Reshape",
        )
        return recent.node(
            "Transpose", [split], [f"{p}/attn/{ordered}"], f"{p}/attn/{ordered}/Transpose", perm=[0, 2, 1, 3]
        )[0]

    def from_start(x: str, axis: int, tag: str) -> str:
        """``x`` from the window's first position on along ``axis``."""
        limit, along = constant(g.inits, "int64_max", [2**63 - 1]), constant(g.inits, f"axis_{axis}", [axis])
        return recent.node("Slice", [x, start, limit, along], [f"{p}/attn/{tag}"], f"{p}/attn/{tag}/Slice")[0]

    for past, new, kind, whole_past in (
        (past_k, k, "key", f"{present_k}/recent"),
        (past_v, v, "value", f"{present_v}/recent"),
    ):
        ordered = to_heads(new, kv_heads, kind, f"{kind}_new")
        recent.node("Concat", [past, ordered], [whole_past], f"{p}/attn/{kind}_present/Concat", axis=2)
        from_start(whole_past, 2, f"recent_{kind}")
    # each layer slices the mask again: outside the If it would copy a prefill's whole mask
    from_start(mask, 3, "recent_mask")
    (o4,) = recent.node(
        op,
        [
            to_heads(q, heads, "query", "query"),
            f"{p}/attn/recent_key",
            f"{p}/attn/recent_value",
            f"{p}/attn/recent_mask",
        ],
        [f"{p}/attn/output_heads"],
        f"{name}_recent",
        **attrs,
    )
    (o3,) = recent.node(
        "Transpose", [o4], [f"{p}/attn/output_tokens"], f"{p}/attn/output_tokens/Transpose", perm=[0, 2, 1, 3]
    )
    recent.node(
        "Reshape",
        [o3, constant(g.inits, "hidden_shape", [0, 0, -1])],
        [f"{out}/recent"],
        f"{p}/attn/output/Reshape",
    )

    def branch(graph: Graph, tag: str) -> onnx.GraphProto:
        names = [f"{out}/{tag}", f"{present_k}/{tag}", f"{present_v}/{tag}"]
        return helper.make_graph(
            graph.nodes,
            f"{p}/attn/{tag}",
            [],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        )

    g.node(
        "If",
        [long_past],
        [out, present_k, present_v],
        f"{p}/attn/If",
        then_branch=branch(recent, "recent"),
        else_branch=branch(plain, "plain"),
    )


def _long_past(g: Graph, window: int) -> tuple[str, str]:
    """Whether the past is long enough for a sliding layer to read only its window
    (:func:`_sliding_attention`), and the window's first position: both once per window."""
    name, start = f"/model/attn_mask/long_past{window}", f"/model/attn_mask/start{window}"
    if any(name in n.output for n in g.nodes):
        return name, start
    (back,) = g.node(
        "Sub",
        ["/model/attn_mask/past", constant(g.inits, f"window_keep{window}", window - 1)],
        [f"/model/attn_mask/back{window}"],
        f"/model/attn_mask/Back{window}",
    )
    # max(past - (window - 1), 0): keys before it are outside every query's window (the mask is
    # by cache index, as transformers' sliding mask is), so leaving them out changes nothing
    (first,) = g.node(
        "Max",
        [back, constant(g.inits, "zero_i64", 0)],
        [f"/model/attn_mask/first{window}"],
        f"/model/attn_mask/First{window}",
    )
    g.node(
        "Unsqueeze",
        [first, constant(g.inits, "axes_0", [0])],
        [start],
        f"/model/attn_mask/Start{window}",
    )
    g.node(
        "Greater",
        ["/model/attn_mask/past", constant(g.inits, f"long_past{window}", 3 * window)],
        [name],
        f"/model/attn_mask/LongPast{window}",
    )
    return name, start


def _windowed(g: Graph, visible: str, window: int) -> str:
    """``visible`` narrowed to a sliding window: query i sees key j only when i - j < window."""
    (gap,) = g.node(
        "Sub",
        ["/model/attn_mask/query_column", "/model/attn_mask/keys"],
        [f"/model/attn_mask/gap{window}"],
        f"/model/attn_mask/Gap{window}",
    )
    (near,) = g.node(
        "Less",
        [gap, constant(g.inits, f"window{window}", window)],
        [f"/model/attn_mask/near{window}"],
        f"/model/attn_mask/Near{window}",
    )
    (out,) = g.node("And", [visible, near], [f"/model/attn_mask/visible{window}"], f"/model/attn_mask/Visible{window}")
    return str(out)


def _gpt2(model: Any, exported: onnx.ModelProto, g: Graph, heads: int, head_dim: int) -> Built:
    """GPT-2: learned positions, LayerNorm with bias, biased projections, tanh GELU. Attention
    is ONNX's own Attention (opset 23) with an explicit mask, not GroupQueryAttention: its
    ``seqlens_k`` reads each row's tokens as a prefix, so a left-padded row came out 2.2 off the
    export, and on the CPU it measured faster (12 layers at 128 tokens 3.4 ms + 0.75 for the
    Split against 5.5; a decode step 4.7 against 5.4 ms, int8, denormals flushed). Each
    projection's bias rides in the next SkipLayerNormalization or its own Add."""
    t = model.transformer
    if "position_ids" not in {v.name for v in exported.graph.input}:
        raise StepError(
            "optimize.decoder: fused GPT-2 needs the export's position_ids input (export.with_past: true gives it)"
        )
    fused = {"Attention": 0, "SkipLayerNormalization": 0, "LayerNormalization": 0, "Gelu": 0}

    def arr(p: torch.Tensor) -> NDArray[np.generic]:
        return p.detach().float().numpy()

    (tok,) = g.node(
        "Gather",
        [g.weight("transformer.wte.weight", arr(t.wte.weight)), "input_ids"],
        ["/model/wte/output"],
        "/model/wte/Gather",
    )
    (pos,) = g.node(
        "Gather",
        [g.weight("transformer.wpe.weight", arr(t.wpe.weight)), "position_ids"],
        ["/model/wpe/output"],
        "/model/wpe/Gather",
    )
    (hidden,) = g.node("Add", [tok, pos], ["/model/embeddings"], "/model/embeddings/Add")
    mask = _additive(g, _visible(g), -1)
    residual: str | None = None
    pending_bias: str | None = None

    def norm(prefix: str, x: str, ln: _LayerNorm, wname: str) -> str:
        nonlocal residual, pending_bias
        gamma, beta = g.weight(f"{wname}.weight", arr(ln.weight)), g.weight(f"{wname}.bias", arr(ln.bias))
        if residual is None:
            (y,) = g.node(
                "LayerNormalization",
                [x, gamma, beta],
                [f"{prefix}/output"],
                f"{prefix}/LayerNorm",
                epsilon=float(ln.eps),
                axis=-1,
            )
            fused["LayerNormalization"] += 1
            residual = x
            return str(y)
        y, _, _, total = g.node(
            "SkipLayerNormalization",
            [x, residual, gamma, beta, pending_bias or ""],
            [f"{prefix}/output", "", "", f"{prefix}/residual"],
            f"{prefix}/SkipLayerNorm",
            MS,
            epsilon=float(ln.eps),
        )
        fused["SkipLayerNormalization"] += 1
        residual, pending_bias = total, None
        return str(y)

    for i, block in enumerate(t.h):
        p = f"/model/layers.{i}"
        x = norm(f"{p}/input_layernorm", hidden, block.ln_1, f"transformer.h.{i}.ln_1")
        (qkv,) = g.node(
            "MatMul",
            [x, g.weight(f"transformer.h.{i}.attn.c_attn.weight", arr(block.attn.c_attn.weight))],
            [f"{p}/attn/qkv_proj/output"],
            f"{p}/attn/qkv_proj/MatMul",
        )
        (qkv,) = g.node(
            "Add",
            [qkv, g.weight(f"transformer.h.{i}.attn.c_attn.bias", arr(block.attn.c_attn.bias))],
            [f"{p}/attn/qkv_proj/biased"],
            f"{p}/attn/qkv_proj/Add",
        )
        # sizes as an input, not num_outputs: ORT's symbolic shape inference (roofline.py) reads those
        sizes = constant(g.inits, "model.qkv_split", [heads * head_dim] * 3)
        q, k, v = g.node(
            "Split", [qkv, sizes], [f"{p}/attn/q", f"{p}/attn/k", f"{p}/attn/v"], f"{p}/attn/Split", axis=-1
        )
        (out, _, _) = g.node(
            "Attention",
            [q, k, v, mask, f"past_key_values.{i}.key", f"past_key_values.{i}.value"],
            [f"{p}/attn/output", f"present.{i}.key", f"present.{i}.value"],
            f"{p}/attn/Attention",
            q_num_heads=heads,
            kv_num_heads=heads,
            scale=head_dim**-0.5,
        )
        fused["Attention"] += 1
        (o,) = g.node(
            "MatMul",
            [out, g.weight(f"transformer.h.{i}.attn.c_proj.weight", arr(block.attn.c_proj.weight))],
            [f"{p}/attn/o_proj/output"],
            f"{p}/attn/o_proj/MatMul",
        )
        pending_bias = g.weight(f"transformer.h.{i}.attn.c_proj.bias", arr(block.attn.c_proj.bias))
        x = norm(f"{p}/post_attention_layernorm", o, block.ln_2, f"transformer.h.{i}.ln_2")
        (fc,) = g.node(
            "MatMul",
            [x, g.weight(f"transformer.h.{i}.mlp.c_fc.weight", arr(block.mlp.c_fc.weight))],
            [f"{p}/mlp/up_proj/output"],
            f"{p}/mlp/up_proj/MatMul",
        )
        # ONNX's tanh Gelu (GPT-2's gelu_new exactly), not the FastGelu contrib op: ORT's CPU
        # kernel for it measured 1.9 ms for the 12 at 128 tokens against FastGelu's 2.6, and
        # the bias Add before it goes into the quantized MatMul
        (fc,) = g.node(
            "Add",
            [fc, g.weight(f"transformer.h.{i}.mlp.c_fc.bias", arr(block.mlp.c_fc.bias))],
            [f"{p}/mlp/up_proj/biased"],
            f"{p}/mlp/up_proj/Add",
        )
        (act,) = g.node("Gelu", [fc], [f"{p}/mlp/act/output"], f"{p}/mlp/act/Gelu", approximate="tanh")
        fused["Gelu"] += 1
        (hidden,) = g.node(
            "MatMul",
            [act, g.weight(f"transformer.h.{i}.mlp.c_proj.weight", arr(block.mlp.c_proj.weight))],
            [f"{p}/mlp/down_proj/output"],
            f"{p}/mlp/down_proj/MatMul",
        )
        pending_bias = g.weight(f"transformer.h.{i}.mlp.c_proj.bias", arr(block.mlp.c_proj.bias))
    x = norm("/model/norm", hidden, t.ln_f, "transformer.ln_f")
    g.node("MatMul", [x, g.weight("lm_head.weight", _linear_t(model.lm_head))], ["logits"], "/lm_head/MatMul")
    return Built(g.model(exported, opset=23), {k: v for k, v in fused.items() if v}, "gpt2")


def constant(inits: list[onnx.TensorProto], name: str, value: float | Sequence[int], dtype: str = "int64") -> str:
    """A small initializer shared by name: written the first time it is asked for."""
    import numpy as np
    from onnx import numpy_helper

    if not any(t.name == name for t in inits):
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
    return name


def _norm(
    node: _NodeFn,
    weight: _WeightFn,
    fused: dict[str, int],
    prefix: str,
    x: str,
    residual: str | None,
    gamma: NDArray[np.generic],
    epsilon: float,
    wname: str,
) -> tuple[str, str]:
    """RMSNorm of ``x`` (+ ``residual`` when there is one, fused): (normalised, new residual)."""
    if residual is None:
        (y,) = node(
            "SimplifiedLayerNormalization",
            [x, weight(wname, gamma)],
            [f"{prefix}/output"],
            f"{prefix}/SimplifiedLayerNorm",
            epsilon=epsilon,
            axis=-1,
            stash_type=1,
        )
        fused["SimplifiedLayerNormalization"] += 1
        return y, x
    y, _, _, total = node(
        "SkipSimplifiedLayerNormalization",
        [x, residual, weight(wname, gamma)],
        [f"{prefix}/output", "", "", f"{prefix}/residual"],
        f"{prefix}/SkipLayerNorm",
        MS,
        epsilon=epsilon,
    )
    fused["SkipSimplifiedLayerNormalization"] += 1
    return y, total


def _plain_norm(
    node: _NodeFn, weight: _WeightFn, fused: dict[str, int], prefix: str, x: str, module: _Weighted, layer: int
) -> str:
    """A Gemma RMSNorm (weights + 1) of ``x`` alone, with no residual to fuse in."""
    gamma = module.weight.detach().float().numpy() + 1.0
    epsilon = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    wname = f"model.layers.{layer}.{prefix.rsplit('/', 1)[-1]}.weight"
    y, _ = _norm(node, weight, fused, prefix, x, None, gamma, epsilon, wname)
    return y


def _head_norm(
    node: _NodeFn,
    weight: _WeightFn,
    inits: list[onnx.TensorProto],
    prefix: str,
    x: str,
    n: int,
    head_dim: int,
    gamma: NDArray[np.generic],
    epsilon: float,
    wname: str,
) -> str:
    """RMSNorm over each head of a [batch, sequence, n * head_dim] tensor."""
    (heads,) = node(
        "Reshape",
        [x, constant(inits, f"shape.heads{n}x{head_dim}", [0, 0, n, head_dim])],
        [f"{prefix}/heads"],
        f"{prefix}/Reshape",
    )
    (y,) = node(
        "SimplifiedLayerNormalization",
        [heads, weight(wname, gamma)],
        [f"{prefix}/normed"],
        f"{prefix}/SimplifiedLayerNorm",
        epsilon=epsilon,
        axis=-1,
        stash_type=1,
    )
    (flat,) = node(
        "Reshape",
        [y, constant(inits, f"shape.flat{n * head_dim}", [0, 0, n * head_dim])],
        [f"{prefix}/output"],
        f"{prefix}/ReshapeBack",
    )
    return str(flat)


def _window(config: object, layer: int) -> int:
    """One layer's sliding window (query i sees key j when i - j < window), -1 for full attention."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window:
        return -1
    if types is not None:
        return int(window) if types[layer] == "sliding_attention" else -1
    return int(window) if getattr(config, "use_sliding_window", True) else -1
