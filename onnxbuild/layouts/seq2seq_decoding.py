"""Running an encoder-decoder (two ONNX files, laid out as sources/seq2seq.py exports them): the
encoder once (its hidden states projected into every decoder layer's cross keys and values),
then the decoder token by token through its self-attention cache, reading those cross keys and
values at each step, on ONNX Runtime; and the same loops on the PyTorch model, for the generate
step's comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxbuild.errors import StepError
from onnxbuild.layouts.decoding import Generation
from onnxbuild.runtimes import sessions
from onnxbuild.sources.decoder import PastLayout
from onnxbuild.sources.seq2seq import (
    cross_inputs,
    cross_outputs,
    decoder_module,
    encoder_module,
    layout_of,
    start_token,
)

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime
    import torch
    from numpy.typing import NDArray

    from onnxbuild.layouts.decoding import Chooser


@dataclass(frozen=True)
class OrtSeq2Seq:
    """An encoder and a decoder session, run as transformers runs the model."""

    encoder: onnxruntime.InferenceSession
    decoder: onnxruntime.InferenceSession
    layout: PastLayout

    @classmethod
    def load(cls, encoder_path: str | Path, decoder_path: str | Path, threads: int = 0) -> OrtSeq2Seq:
        import onnxruntime as ort

        from onnxbuild.sources.decoder import layout_from_session

        options = sessions.options(threads)
        loaded = []
        for path in (encoder_path, decoder_path):
            try:
                loaded.append(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
            except Exception as exc:
                raise StepError(
                    f"ONNX Runtime cannot load {path}: "
                    f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__}"
                ) from None
        return cls(loaded[0], loaded[1], layout_from_session(loaded[1]))

    def encode(self, feeds: dict[str, NDArray[np.generic]]) -> list[NDArray[np.generic]]:
        """Every decoder layer's cross key and value, [batch, heads, encoder positions, head_dim]."""
        cross: list[NDArray[np.generic]] = self.encoder.run(cross_outputs(self.layout), feeds)
        return cross

    @property
    def masked(self) -> bool:
        return any(i.name == "encoder_attention_mask" for i in self.decoder.get_inputs())

    def empty_past(self, batch: int) -> list[NDArray[np.generic]]:
        import numpy as np

        return [
            np.zeros((batch, self.layout.kv_heads, 0, self.layout.head_dim), dtype=np.float32)
            for _ in self.layout.past_names
        ]

    def step(
        self,
        ids: NDArray[np.int64],
        cross: list[NDArray[np.generic]],
        mask: NDArray[np.generic] | None,
        past: list[NDArray[np.generic]],
    ) -> tuple[NDArray[np.generic], list[NDArray[np.generic]]]:
        """New tokens through the decoder: (logits, the grown self-attention cache)."""
        feeds = {
            "input_ids": ids,
            **({"encoder_attention_mask": mask} if self.masked else {}),
            **dict(zip(self.layout.past_names, past, strict=True)),
            **dict(zip(cross_inputs(self.layout), cross, strict=True)),
        }
        out = self.decoder.run(None, feeds)
        return out[0], list(out[1:])

    def generate(
        self,
        feeds: dict[str, NDArray[np.generic]],
        start: int,
        max_new_tokens: int,
        eos: int | None,
        choose: Chooser | None = None,
    ) -> Generation:
        """Greedy (or ``choose``'s) decoding from the start token, stopping once every row
        has produced ``eos``."""
        import numpy as np

        from onnxbuild.layouts.decoding import greedy

        choose = choose or greedy

        cross = self.encode(feeds)
        mask = feeds.get("attention_mask")
        batch = cross[0].shape[0]
        past = self.empty_past(batch)
        cur = np.full((batch, 1), start, dtype=np.int64)
        tokens, steps = [], []
        finished = np.zeros(batch, dtype=bool)
        for _ in range(max_new_tokens):
            logits, past = self.step(cur, cross, mask, past)
            last = np.asarray(logits[:, -1, :], dtype=np.float32)
            steps.append(last)
            nxt = np.where(finished, eos if eos is not None else 0, choose(last))
            tokens.append(nxt)
            if eos is not None:
                finished |= nxt == eos
                if finished.all():
                    break
            cur = nxt[:, None]
        return Generation(np.stack(tokens, axis=1), steps)


def torch_generate(
    model: Any, feeds: dict[str, NDArray[np.generic]], max_new_tokens: int, choose: Chooser
) -> Generation:
    """The same loop on the PyTorch model through the export's own wrappers, for the seeded
    sampling comparison (no end-of-text stop, so both make as many tokens)."""
    import numpy as np
    import torch

    layout = layout_of(model.config)
    names = list(feeds)
    masked = "attention_mask" in names
    encoder, decoder = encoder_module(model, names, layout), decoder_module(model, layout, masked)
    mask = (torch.from_numpy(feeds["attention_mask"]),) if masked else ()
    tokens, steps = [], []
    with torch.inference_mode():
        hidden, *cross = encoder(*(torch.from_numpy(feeds[n]) for n in names))
        batch = hidden.shape[0]
        past: list[torch.Tensor] = [
            torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names
        ]
        cur = torch.full((batch, 1), start_token(model.config), dtype=torch.long)
        for _ in range(max_new_tokens):
            logits, *past = decoder(cur, *mask, *past, *cross)
            last = logits[:, -1, :].float().numpy()
            steps.append(last)
            nxt = choose(last)
            tokens.append(nxt)
            cur = torch.from_numpy(nxt[:, None])
    return Generation(np.stack(tokens, axis=1), steps)


def hf_generate(
    model: Any, feeds: dict[str, NDArray[np.generic]], max_new_tokens: int, stop_at_eos: bool = True
) -> Generation:
    """transformers' own greedy generate(), with none of the generation config's extra rules
    (forced first or last tokens, minimum lengths, n-gram bans): what a greedy decoder over
    the exported files computes, stopping at end-of-text as they do."""
    import numpy as np
    import torch
    from transformers import GenerationConfig, GenerationMixin

    config = model.config
    plain = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        decoder_start_token_id=start_token(config),
        eos_token_id=getattr(config, "eos_token_id", None) if stop_at_eos else None,
        pad_token_id=getattr(config, "pad_token_id", None) if getattr(config, "pad_token_id", None) is not None else 0,
    )
    # In place of the model's own: generate() fills fields left unset in a passed config from
    # the model's (Marian's forced_eos_token_id, say), which would add rules back.
    saved, model.generation_config = model.generation_config, plain
    try:
        main, *rest = feeds
        extra = {name: torch.from_numpy(feeds[name]) for name in rest}
        with torch.inference_mode():
            # GenerationMixin's own: Whisper overrides generate() with language detection,
            # timestamps and prompts, none of which a greedy loop over the files does.
            out = GenerationMixin.generate(
                model, inputs=torch.from_numpy(feeds[main]), **extra, output_logits=True, return_dict_in_generate=True
            )
    finally:
        model.generation_config = saved
    tokens = out.sequences[:, 1:].numpy().astype(np.int64)  # the start token is not generated
    return Generation(tokens, [t.float().numpy() for t in out.logits])
