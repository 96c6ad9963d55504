"""Running a decoder with a KV cache: greedy or seeded sampled generation on an ONNX Runtime session
(or any session with its interface, OpenVINO's included, which may hold the cache itself), and
the same loops on the PyTorch model, so the generate step, the benchmark and ``onnxbuild run``
decode alike. The export side (the wrapper, the input names, the cache layout) is in
sources/decoder.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from onnxbuild.errors import StepError
from onnxbuild.runtimes.sessions import Session
from onnxbuild.sources.decoder import layout_from_session

if TYPE_CHECKING:
    import numpy as np
    import torch
    from numpy.typing import NDArray

    from onnxbuild.runtimes.sessions import Feed

    Chooser = Callable[[NDArray[np.float32]], NDArray[np.int64]]
    """The next token of each row from its last-position logits, [batch, vocab] -> [batch]."""


@dataclass(frozen=True)
class Sampling:
    """Seeded sampling that both engines share: the same uniform draw picks from each one's
    own probabilities, so near-equal logits pick the same token."""

    seed: int
    temperature: float
    top_k: int

    def chooser(self) -> Chooser:
        import numpy as np

        rng = np.random.default_rng(self.seed)

        def choose(logits: NDArray[np.float32]) -> NDArray[np.int64]:
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


def greedy(logits: NDArray[np.generic]) -> NDArray[np.int64]:
    import numpy as np

    return np.asarray(logits.argmax(-1), dtype=np.int64)


@dataclass(frozen=True)
class Generation:
    """Greedy (or seeded sampled) tokens and per-step logits from a decoder run."""

    tokens: NDArray[np.int64]
    """[batch, new tokens] int64."""
    logits: list[NDArray[np.float32]]
    """Last-position logits at each step, [batch, vocab] float32."""


@runtime_checkable
class HoldsCache(Protocol):
    """A session that may keep its KV cache between calls (openvino_target.Session: a decoder
    compiled stateful). When ``keeps_past`` is true its presents need not come out: ``kept()``
    gives markers that stand for them as the next call's past."""

    @property
    def keeps_past(self) -> bool: ...

    def kept(self) -> Sequence[Feed]: ...

    def run(self, names: list[str] | None, feeds: Mapping[str, Feed], /) -> list[NDArray[np.generic]]: ...


class OrtDecoder:
    """Greedy or sampled decoding with a session of a with-past model: ONNX Runtime's, or any
    with its ``get_inputs``/``get_outputs``/``run`` (OpenVINO's, which may hold the cache)."""

    def __init__(self, session: Session, prefill: Session | None = None) -> None:
        self.session = session
        self.layout = layout_from_session(session)
        self.inputs = {i.name for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]
        self.float = "float16" if self.layout.dtype == "float16" else "float32"
        self.prefill = prefill
        """A second file for the first call (the prompt, from an empty past), as
        onnxruntime-genai's decoder pipeline runs one (onnxbuild.steps.serve)."""
        if prefill is not None and (
            layout_from_session(prefill) != self.layout
            or {i.name for i in prefill.get_inputs()} != self.inputs
            or [o.name for o in prefill.get_outputs()] != self.outputs
        ):
            raise StepError("the prefill file does not take and return the same tensors as the decode file")

    def feeds(self, ids: NDArray[np.int64], past: Sequence[Feed], past_len: int) -> dict[str, Feed]:
        import numpy as np

        batch, seq = ids.shape
        feeds: dict[str, Feed] = {"input_ids": ids}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((batch, past_len + seq), dtype=np.int64)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.broadcast_to(
                np.arange(past_len, past_len + seq, dtype=np.int64), (batch, seq)
            ).copy()
        feeds.update(zip(self.layout.past_names, past, strict=True))
        return feeds

    def empty_past(self, batch: int) -> list[NDArray[np.generic]]:
        import numpy as np

        shape = (batch, self.layout.kv_heads, 0, self.layout.head_dim)
        return [np.zeros(shape, dtype=self.float) for _ in self.layout.past_names]

    def forward(
        self, ids: NDArray[np.int64], past: Sequence[Feed], past_len: int
    ) -> tuple[NDArray[np.generic], Sequence[Feed]]:
        if isinstance(self.session, HoldsCache) and self.session.keeps_past:
            # a stateful OpenVINO session holds the cache: reading it out to feed it back in
            # would copy it twice a step, so only the logits come out, and markers go back in
            (logits,) = self.session.run(["logits"], self.feeds(ids, past, past_len))
            return logits, self.session.kept()
        session = self.prefill if self.prefill is not None and past_len == 0 else self.session
        out = session.run(None, self.feeds(ids, past, past_len))
        named = dict(zip(self.outputs, out, strict=True))
        return named["logits"], [named[n] for n in self.layout.present_names]

    def logits_as_served(self, ids: NDArray[np.int64], start: int) -> NDArray[np.float32]:
        """Logits at every position of ``ids`` ([batch, sequence] -> [batch, sequence, vocab],
        float32) as generation computes them: the first ``start`` tokens in one call from an empty
        past (on the prefill file, where there is one), then one token per call."""
        import numpy as np

        past: Sequence[Feed]
        logits, past = self.forward(ids[:, :start], self.empty_past(ids.shape[0]), 0)
        parts = [np.asarray(logits, np.float32)]
        for t in range(start, ids.shape[1]):
            logits, past = self.forward(ids[:, t : t + 1], past, t)
            parts.append(np.asarray(logits, np.float32))
        return np.concatenate(parts, axis=1)

    def generate(
        self, prompt: NDArray[np.int64], max_new_tokens: int, choose: Chooser = greedy, eos: int | None = None
    ) -> Generation:
        """Up to ``max_new_tokens`` tokens; with ``eos``, stop once every row has produced it."""
        import numpy as np

        past: Sequence[Feed] = self.empty_past(prompt.shape[0])
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


def torch_generate(
    model: torch.nn.Module, prompt: NDArray[np.int64], max_new_tokens: int, choose: Chooser = greedy
) -> Generation:
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


def hf_generate(model: Any, prompt: NDArray[np.int64], max_new_tokens: int) -> Generation:
    # model left untyped: transformers types generate()'s result as a tensor or one of several outputs
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
