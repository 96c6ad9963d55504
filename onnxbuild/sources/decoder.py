"""Causal LMs with a KV cache: the export wrapper, input names and the generation loops.

One place knows how a transformers decoder takes its past: the wrapper turns the flat
``past_key_values.{i}.key`` / ``.value`` tensors of the ONNX signature into a
transformers ``DynamicCache`` and the returned cache back into ``present.{i}.key`` /
``.value`` (transformers 5.x renamed the ``past_key_values`` argument to ``cache``;
the wrapper passes whichever the model takes). The same loops drive ONNX Runtime and
PyTorch, so the generate step, the benchmark and ``onnxbuild run`` decode alike.

Axes: ``input_ids`` and ``position_ids`` are [batch, sequence]; ``attention_mask`` is
[batch, total_sequence] (past + new tokens); past tensors are [batch, kv_heads,
past_sequence, head_dim] and presents [batch, kv_heads, total_sequence, head_dim]. A
prefill is a call with past_sequence 0.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import ExportSection

PAST = "past_key_values.{i}.{kv}"
PRESENT = "present.{i}.{kv}"
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
GENAI_INPUTS = ("input_ids", "attention_mask", "position_ids")
"""The token inputs onnxruntime-genai feeds a decoder by name (it has no token_type_ids)."""


@dataclass(frozen=True)
class PastLayout:
    """The shape of one model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"

    @property
    def past_names(self) -> list[str]:
        return [PAST.format(i=i, kv=kv) for i in range(self.layers) for kv in ("key", "value")]

    @property
    def present_names(self) -> list[str]:
        return [PRESENT.format(i=i, kv=kv) for i in range(self.layers) for kv in ("key", "value")]

    def past_specs(self) -> list[dict[str, Any]]:
        return [
            {"name": n, "dtype": self.dtype, "shape": ["batch", self.kv_heads, "past_sequence", self.head_dim]}
            for n in self.past_names
        ]


def layout_of(config: Any) -> PastLayout:
    """The KV-cache layout of a transformers config (GPT-2 maps n_layer/n_head onto these names)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return PastLayout(layers=int(config.num_hidden_layers), kv_heads=kv_heads, head_dim=head_dim)


def layout_from_session(session: Any) -> PastLayout:
    """The KV-cache layout an ONNX model declares in its inputs."""
    past = [i for i in session.get_inputs() if i.name.startswith(PAST_PREFIX)]
    if not past:
        raise StepError("the model has no past_key_values.* inputs: it was not exported with export.with_past: true")
    shape = past[0].shape
    dtype = "float16" if "float16" in past[0].type else "float32"
    return PastLayout(layers=len(past) // 2, kv_heads=int(shape[1]), head_dim=int(shape[3]), dtype=dtype)


def io_names(export: ExportSection, layout: PastLayout) -> tuple[list[dict[str, Any]], list[str]]:
    """The full input specs and output names of a with-past export."""
    return [dict(t) for t in export["inputs"]] + layout.past_specs(), list(export["outputs"]) + layout.present_names


def wrap_with_past(model: Any, token_names: list[str], outputs: list[str], layout: PastLayout) -> Any:
    """A module taking (token inputs..., past tensors...) and returning (outputs..., presents...)."""
    import torch
    from transformers import DynamicCache

    params = set(inspect.signature(model.forward).parameters)
    cache_arg = "cache" if "cache" in params else "past_key_values"
    count = len(token_names)

    class WithPast(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            kwargs = dict(zip(token_names, args[:count], strict=True))
            past = args[count:]
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layout.layers)]
            kwargs[cache_arg] = DynamicCache(ddp_cache_data=pairs, config=self.model.config)
            out = self.model(**kwargs, use_cache=True, return_dict=True)
            cache = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
            flat: list[Any] = []
            for layer in cache.layers:
                flat += [layer.keys, layer.values]
            return (*(out[name] for name in outputs), *flat)

    return WithPast().eval()


# ---------------------------------------------------------------- choosing tokens


@dataclass(frozen=True)
class Sampling:
    """Seeded sampling that both engines share: the same uniform draw picks from each one's
    own probabilities, so near-equal logits pick the same token."""

    seed: int
    temperature: float
    top_k: int

    def chooser(self) -> Any:
        import numpy as np

        rng = np.random.default_rng(self.seed)

        def choose(logits: Any) -> Any:
            x = logits.astype(np.float64) / max(self.temperature, 1e-6)
            picks = []
            for row in x:
                order = np.argsort(-row, kind="stable")
                if self.top_k:
                    order = order[: self.top_k]
                p = np.exp(row[order] - row[order].max())
                cdf = np.cumsum(p / p.sum())
                picks.append(order[min(int(np.searchsorted(cdf, rng.random())), len(order) - 1)])
            return np.asarray(picks, dtype=np.int64)

        return choose


def greedy(logits: Any) -> Any:
    import numpy as np

    return np.asarray(logits.argmax(-1), dtype=np.int64)


# ---------------------------------------------------------------- loops


@dataclass(frozen=True)
class Generation:
    """Greedy (or seeded sampled) tokens and per-step logits from a decoder run."""

    tokens: Any
    """[batch, new tokens] int64."""
    logits: list[Any]
    """Last-position logits at each step, [batch, vocab] float32."""


@runtime_checkable
class HoldsCache(Protocol):
    """A session that may keep its KV cache between calls (openvino_target.Session: a decoder
    compiled stateful). When ``keeps_past`` is true its presents need not come out: ``kept()``
    gives markers that stand for them as the next call's past."""

    @property
    def keeps_past(self) -> bool: ...

    def kept(self) -> list[Any]: ...

    def run(self, names: list[str] | None, feeds: dict[str, Any]) -> list[Any]: ...


class OrtDecoder:
    """Greedy or sampled decoding with a session of a with-past model: ONNX Runtime's, or any
    with its ``get_inputs``/``get_outputs``/``run`` (OpenVINO's, which may hold the cache)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.layout = layout_from_session(session)
        self.inputs = {i.name for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]
        self.float = "float16" if self.layout.dtype == "float16" else "float32"

    def feeds(self, ids: Any, past: list[Any], past_len: int) -> dict[str, Any]:
        import numpy as np

        batch, seq = ids.shape
        feeds: dict[str, Any] = {"input_ids": ids}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((batch, past_len + seq), dtype=np.int64)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.broadcast_to(
                np.arange(past_len, past_len + seq, dtype=np.int64), (batch, seq)
            ).copy()
        feeds.update(zip(self.layout.past_names, past, strict=True))
        return feeds

    def empty_past(self, batch: int) -> list[Any]:
        import numpy as np

        shape = (batch, self.layout.kv_heads, 0, self.layout.head_dim)
        return [np.zeros(shape, dtype=self.float) for _ in self.layout.past_names]

    def forward(self, ids: Any, past: list[Any], past_len: int) -> tuple[Any, list[Any]]:
        if isinstance(self.session, HoldsCache) and self.session.keeps_past:
            # a stateful OpenVINO session holds the cache: reading it out to feed it back in
            # would copy it twice a step, so only the logits come out, and markers go back in
            (logits,) = self.session.run(["logits"], self.feeds(ids, past, past_len))
            return logits, self.session.kept()
        out = self.session.run(None, self.feeds(ids, past, past_len))
        named = dict(zip(self.outputs, out, strict=True))
        return named["logits"], [named[n] for n in self.layout.present_names]

    def generate(self, prompt: Any, max_new_tokens: int, choose: Any = greedy, eos: int | None = None) -> Generation:
        """Up to ``max_new_tokens`` tokens; with ``eos``, stop once every row has produced it."""
        import numpy as np

        past = self.empty_past(prompt.shape[0])
        ids, past_len = prompt, 0
        tokens, steps = [], []
        finished = np.zeros(prompt.shape[0], dtype=bool)
        for _ in range(max_new_tokens):
            logits, past = self.forward(ids, past, past_len)
            last = np.asarray(logits[:, -1, :], dtype=np.float32)
            steps.append(last)
            nxt = choose(last)
            tokens.append(nxt)
            if eos is not None:
                finished |= nxt == eos
                if finished.all():
                    break
            past_len += ids.shape[1]
            ids = nxt[:, None]
        return Generation(np.stack(tokens, axis=1), steps)


def torch_generate(model: Any, prompt: Any, max_new_tokens: int, choose: Any = greedy) -> Generation:
    """The same loop on the PyTorch model (its own DynamicCache), for sampling comparisons."""
    import numpy as np
    import torch

    ids = torch.from_numpy(prompt)
    cache = None
    tokens, steps = [], []
    total = prompt.shape[1]
    params = set(inspect.signature(model.forward).parameters)
    cache_arg = "cache" if "cache" in params else "past_key_values"
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            mask = torch.ones((ids.shape[0], total), dtype=torch.long)
            out = model(
                input_ids=ids,
                attention_mask=mask,
                use_cache=True,
                return_dict=True,
                **({cache_arg: cache} if cache is not None else {}),
            )
            cache = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
            last = out["logits"][:, -1, :].float().numpy()
            steps.append(last)
            nxt = choose(last)
            tokens.append(nxt)
            ids = torch.from_numpy(nxt[:, None])
            total += 1
    return Generation(np.stack(tokens, axis=1), steps)


def hf_generate(model: Any, prompt: Any, max_new_tokens: int) -> Generation:
    """Greedy decoding by transformers' own generate(), end-of-text ignored so lengths match."""
    import numpy as np
    import torch

    ids = torch.from_numpy(prompt)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    tokens = out.sequences[:, prompt.shape[1] :].numpy().astype(np.int64)
    return Generation(tokens, [t.float().numpy() for t in out.logits])


def genai_config(config: Any, layout: PastLayout, export: ExportSection) -> str:
    """genai_config.json for onnxruntime-genai: where the decoder's inputs and outputs are and
    how big its cache is (greedy search by default; the caller's generator params override).

    The type is genai's generic decoder-only runner (registered as "llama"), whatever the
    architecture: genai's own "gpt2" type expects the combined ``past_%d`` cache of ORT's
    old GPT-2 exports, not the separate key/value tensors written here. Checked with
    onnxruntime-genai 0.18 on tiny GPT-2: the same greedy tokens as ``onnxbuild run``."""
    from onnxbuild._util import pretty_json

    names = {t["name"] for t in export["inputs"]}
    inputs = {n: n for n in GENAI_INPUTS if n in names}
    eos = getattr(config, "eos_token_id", None)
    bos = getattr(config, "bos_token_id", None)
    context = int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0) or 2048)
    doc = {
        "model": {
            "type": "llama",
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": getattr(config, "pad_token_id", None) or eos,
            "context_length": context,
            "vocab_size": int(config.vocab_size),
            "decoder": {
                "filename": "model.onnx",
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": layout.head_dim,
                "hidden_size": int(config.hidden_size),
                "num_attention_heads": int(config.num_attention_heads),
                "num_hidden_layers": layout.layers,
                "num_key_value_heads": layout.kv_heads,
                "inputs": {
                    **inputs,
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    return pretty_json(doc)
