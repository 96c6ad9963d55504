"""Running a vision-language model (three ONNX files, laid out as sources/vlm.py exports them):
the images through vision.onnx once, the prompt's embeddings with their image tokens replaced,
then the decoder token by token through its cache, each new token embedded with no image
features; and the same loop on the PyTorch model, for the generate step's comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.layouts.decoding import Generation
from onnxbuild.runtimes import sessions
from onnxbuild.sources.decoder import PastLayout
from onnxbuild.sources.vlm import EMBEDS, FEATURES, PIXELS, Prompt

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime
    from numpy.typing import NDArray
    from transformers import PreTrainedModel

    from onnxbuild.layouts.decoding import Chooser


@dataclass(frozen=True)
class OrtVlm:
    """A vision, an embedding and a decoder session, run as transformers runs the model."""

    vision: onnxruntime.InferenceSession
    embedding: onnxruntime.InferenceSession
    decoder: onnxruntime.InferenceSession
    layout: PastLayout

    @classmethod
    def load(cls, paths: list[Path], threads: int = 0) -> OrtVlm:
        import onnxruntime as ort

        from onnxbuild.sources.decoder import layout_from_session

        options = sessions.options(threads)
        loaded = []
        for path in paths:
            try:
                loaded.append(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))
            except Exception as exc:
                raise StepError(
                    f"ONNX Runtime cannot load {path}: "
                    f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__}"
                ) from None
        vision, embedding, decoder = loaded
        return cls(vision, embedding, decoder, layout_from_session(decoder))

    @property
    def image_shape(self) -> list[int | str]:
        """[num_images, channels, height, width] as vision.onnx declares them."""
        return list(self.vision.get_inputs()[0].shape)

    @property
    def hidden(self) -> int:
        size = self.embedding.get_inputs()[1].shape[1]
        if not isinstance(size, int):
            raise StepError("embedding.onnx declares no fixed hidden size for image_features (not an onnxbuild export)")
        return size

    def features(self, pixel_values: NDArray[np.generic]) -> NDArray[np.generic]:
        found: NDArray[np.generic] = self.vision.run([FEATURES], {PIXELS: pixel_values})[0]
        return found

    def no_features(self) -> NDArray[np.float32]:
        import numpy as np

        return np.zeros((0, self.hidden), dtype=np.float32)

    def embed(self, ids: NDArray[np.int64], features: NDArray[np.generic]) -> NDArray[np.generic]:
        found: NDArray[np.generic] = self.embedding.run([EMBEDS], {"input_ids": ids, FEATURES: features})[0]
        return found

    def empty_past(self, batch: int) -> list[NDArray[np.generic]]:
        import numpy as np

        return [
            np.zeros((batch, self.layout.kv_heads, 0, self.layout.head_dim), dtype=np.float32)
            for _ in self.layout.past_names
        ]

    def step(
        self,
        embeds: NDArray[np.generic],
        mask: NDArray[np.int64],
        positions: NDArray[np.int64],
        past: list[NDArray[np.generic]],
    ) -> tuple[NDArray[np.generic], list[NDArray[np.generic]]]:
        feeds = {
            EMBEDS: embeds,
            "attention_mask": mask,
            "position_ids": positions,
            **dict(zip(self.layout.past_names, past, strict=True)),
        }
        out = self.decoder.run(None, feeds)
        return out[0], list(out[1:])

    def generate(
        self,
        prompt: Prompt,
        pixel_values: NDArray[np.generic],
        max_new_tokens: int,
        eos: int | None,
        choose: Chooser | None = None,
    ) -> Generation:
        """Greedy (or ``choose``'s) decoding after the prompt, stopping once every row has
        produced ``eos``."""
        import numpy as np

        from onnxbuild.layouts.decoding import greedy

        choose = choose or greedy
        batch = prompt.input_ids.shape[0]
        embeds = self.embed(prompt.input_ids, self.features(pixel_values))
        mask, positions = prompt.attention_mask, prompt.position_ids
        past = self.empty_past(batch)
        tokens, steps = [], []
        finished = np.zeros(batch, dtype=bool)
        for _ in range(max_new_tokens):
            logits, past = self.step(embeds, mask, positions, past)
            last = np.asarray(logits[:, -1, :], dtype=np.float32)
            steps.append(last)
            nxt = np.where(finished, eos if eos is not None else 0, choose(last))
            tokens.append(nxt)
            if eos is not None:
                finished |= nxt == eos
                if finished.all():
                    break
            embeds = self.embed(nxt[:, None], self.no_features())
            positions = positions[:, -1:] + 1
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=mask.dtype)], axis=1)
        return Generation(np.stack(tokens, axis=1), steps)


def torch_generate(
    model: PreTrainedModel, prompt: Prompt, pixel_values: NDArray[np.generic], max_new_tokens: int, choose: Chooser
) -> Generation:
    """The same loop on the PyTorch model through the export's own wrappers, for the seeded
    sampling comparison (no end-of-text stop, so both make as many tokens)."""
    import numpy as np
    import torch

    from onnxbuild.sources import vlm

    layout = vlm.layout_of(model)
    vision, embedding = vlm.vision_module(model), vlm.embedding_module(model)
    decoder = vlm.decoder_module(model, layout)
    batch = prompt.input_ids.shape[0]
    mask, positions = torch.from_numpy(prompt.attention_mask), torch.from_numpy(prompt.position_ids)
    tokens, steps = [], []
    with torch.inference_mode():
        (features,) = vision(torch.from_numpy(pixel_values))
        (embeds,) = embedding(torch.from_numpy(prompt.input_ids), features)
        none = features[:0]
        past: list[torch.Tensor] = [
            torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names
        ]
        for _ in range(max_new_tokens):
            logits, *past = decoder(embeds, mask, positions, *past)
            last = logits[:, -1, :].float().numpy()
            steps.append(last)
            nxt = choose(last)
            tokens.append(nxt)
            (embeds,) = embedding(torch.from_numpy(nxt[:, None]), none)
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype)], dim=1)
    return Generation(np.stack(tokens, axis=1), steps)


def hf_generate(
    model: PreTrainedModel,
    prompt: Prompt,
    pixel_values: NDArray[np.generic],
    max_new_tokens: int,
    stop_at_eos: bool = True,
) -> Generation:
    """transformers' own greedy generate() with the images, with none of the generation
    config's extra rules: what a greedy loop over the files computes, stopping at end-of-text
    as it does."""
    import numpy as np
    import torch
    from transformers import GenerationConfig, GenerationMixin

    from onnxbuild.sources.vlm import family

    text = model.config.get_text_config()
    eos = getattr(text, "eos_token_id", None)
    pad = getattr(text, "pad_token_id", None)
    plain = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos if stop_at_eos else None,
        pad_token_id=pad if pad is not None else 0,
    )
    # in place of the model's own: generate() fills fields left unset in a passed config from it
    saved, model.generation_config = model.generation_config, plain
    pixels = family(model).pixels(torch.from_numpy(pixel_values), prompt.counts)
    try:
        with torch.inference_mode():
            out = GenerationMixin.generate(
                model,
                inputs=torch.from_numpy(prompt.input_ids),
                attention_mask=torch.from_numpy(prompt.attention_mask),
                **pixels,
                output_logits=True,
                return_dict_in_generate=True,
            )
    finally:
        model.generation_config = saved
    tokens = out.sequences[:, prompt.input_ids.shape[1] :].numpy().astype(np.int64)
    return Generation(tokens, [t.float().numpy() for t in out.logits])
