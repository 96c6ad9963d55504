"""Vision-language models (LLaVA, Idefics3, SmolVLM): three ONNX files and the wrappers that
trace them (the loops that run them are in layouts/vlm_decoding.py, their validation in
steps/validating/vlm.py).

The layout is onnxruntime-genai's for its multimodal types (phi3v):

- ``vision.onnx``: ``pixel_values`` [num_images, channels, height, width] -> ``image_features``
  [num_image_tokens, hidden]: the vision tower and the projection into the language model's
  embedding space (LLaVA's chosen feature layer; Idefics3's pixel shuffle), every image's
  tokens in one list.
- ``embedding.onnx``: ``input_ids`` [batch, sequence] and ``image_features`` -> ``inputs_embeds``
  [batch, sequence, hidden]: the token embeddings with the image tokens' rows replaced, in
  order, by the features (transformers' ``masked_scatter``, as NonZero + ScatterND). A decode
  step passes 0 feature rows; only as many image tokens as there are rows are replaced, so an
  image token the model generates is embedded as text, as transformers' generate() does.
- ``decoder.onnx``: ``inputs_embeds``, ``attention_mask`` [batch, total_sequence], ``position_ids``
  and the cache ``past_key_values.{i}.key|value`` -> ``logits`` and ``present.{i}.key|value``: the
  language model and its head. A prefill is a call with an empty cache.

Each family (sources/vlm_families.py) says how its images become features in a form a trace
keeps dynamic, and how transformers itself computes them, which validation holds the file to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxbuild.recipe.sections import Tensor
from onnxbuild.recipe.tasks import EMBEDDING_FILE, VISION_FILE, VLM_DECODER_FILE
from onnxbuild.sources.decoder import PastLayout, genai_decoder

# the families are this module's too: callers import them from here
from onnxbuild.sources.vlm_families import MODEL_TYPES as MODEL_TYPES
from onnxbuild.sources.vlm_families import PIXELS as PIXELS
from onnxbuild.sources.vlm_families import family as family

if TYPE_CHECKING:
    import numpy as np
    import torch
    from numpy.typing import NDArray
    from transformers import PretrainedConfig, PreTrainedModel

FILES = (VISION_FILE, EMBEDDING_FILE, VLM_DECODER_FILE)
FEATURES = "image_features"
EMBEDS = "inputs_embeds"


def image_token(model: PreTrainedModel) -> int:
    """The placeholder id the prompt holds once per image feature."""
    config = model.config
    found = getattr(config, "image_token_id", None)
    return int(found if found is not None else config.image_token_index)


def text_config(model: PreTrainedModel) -> PretrainedConfig:
    return model.config.get_text_config()


def seeded_images(model: PreTrainedModel, count: int, seed: int) -> NDArray[np.float32]:
    """``count`` seeded images of the vision tower's size, as a processor gives them: 8-bit
    pixels scaled to [-1, 1] (make_inputs' images)."""
    import numpy as np

    vision = model.config.vision_config
    size = vision.image_size
    height, width = (size, size) if isinstance(size, int) else size
    shape = (count, int(getattr(vision, "num_channels", 3)), int(height), int(width))
    pixels = np.random.default_rng(seed).integers(0, 256, size=shape).astype(np.float32) / 255.0
    return ((pixels - 0.5) / 0.5).astype(np.float32)


def tokens_per_image(model: PreTrainedModel) -> int:
    """How many placeholder tokens one image's features fill (one image through the vision tower)."""
    import torch

    with torch.no_grad():
        (features,) = vision_module(model)(torch.from_numpy(seeded_images(model, 1, seed=0)))
    return int(features.shape[0])


def layout_of(model: PreTrainedModel) -> PastLayout:
    """The language model's KV cache, as it writes it: one token through an empty cache."""
    import torch

    lm = model.get_decoder()  # type: ignore[no-untyped-call]
    hidden = int(text_config(model).hidden_size)
    with torch.no_grad():
        out = lm(
            inputs_embeds=torch.zeros((1, 1, hidden)),
            attention_mask=torch.ones((1, 1), dtype=torch.long),
            use_cache=True,
            return_dict=True,
        )
    cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
    first = cache.layers[0].keys
    return PastLayout(layers=len(cache.layers), kv_heads=int(first.shape[1]), head_dim=int(first.shape[3]))


def vision_module(model: PreTrainedModel) -> torch.nn.Module:
    """(pixel_values,) -> (image_features,)."""
    return family(model).vision(model)


def embedding_module(model: PreTrainedModel) -> torch.nn.Module:
    """(input_ids, image_features) -> (inputs_embeds,)."""
    import torch

    token = image_token(model)

    class Embedding(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = model.get_input_embeddings()

        def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> tuple[torch.Tensor]:
            embeds = self.embed(input_ids)
            # the first rows-many image tokens, in row-major order as masked_scatter fills them;
            # an index_put traces to ScatterND, which takes 0 rows on a decode step
            where = torch.nonzero(input_ids == token)[: image_features.shape[0]]
            return (embeds.index_put((where[:, 0], where[:, 1]), image_features.to(embeds.dtype)),)

    return Embedding().eval()


def decoder_module(model: PreTrainedModel, layout: PastLayout) -> torch.nn.Module:
    """(inputs_embeds, attention_mask, position_ids, past...) -> (logits, presents...)."""
    import torch
    from transformers import DynamicCache

    class Decoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lm = model.get_decoder()  # type: ignore[no-untyped-call]
            self.head = model.get_output_embeddings()  # type: ignore[no-untyped-call]

        def forward(
            self,
            inputs_embeds: torch.Tensor,
            attention_mask: torch.Tensor,
            position_ids: torch.Tensor,
            *past: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layout.layers)])
            out = self.lm(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                return_dict=True,
            )
            grown = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
            flat: list[torch.Tensor] = []
            for layer in grown.layers:
                flat += [layer.keys, layer.values]
            return (self.head(out.last_hidden_state), *flat)

    return Decoder().eval()


def _axes(specs: list[Tensor]) -> dict[str, dict[int, str]]:
    return {t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in specs}


@dataclass(frozen=True)
class FileIO:
    """One file's inputs, output names and dynamic axes, as torch.onnx.export takes them."""

    inputs: list[Tensor]
    outputs: list[str]
    axes: dict[str, dict[int, str]]

    @property
    def input_names(self) -> list[str]:
        return [t["name"] for t in self.inputs]


def vision_io(channels: int, height: int, width: int) -> FileIO:
    inputs: list[Tensor] = [{"name": PIXELS, "dtype": "float32", "shape": ["num_images", channels, height, width]}]
    return FileIO(inputs, [FEATURES], {**_axes(inputs), FEATURES: {0: "num_image_tokens"}})


def embedding_io(hidden: int) -> FileIO:
    inputs: list[Tensor] = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
        {"name": FEATURES, "dtype": "float32", "shape": ["num_image_tokens", hidden]},
    ]
    return FileIO(inputs, [EMBEDS], {**_axes(inputs), EMBEDS: {0: "batch", 1: "sequence"}})


def decoder_io(layout: PastLayout, hidden: int) -> FileIO:
    inputs: list[Tensor] = [
        {"name": EMBEDS, "dtype": "float32", "shape": ["batch", "sequence", hidden]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total_sequence"]},
        {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
        *layout.past_specs(),
    ]
    axes = _axes(inputs)
    axes["logits"] = {0: "batch", 1: "sequence"}
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in layout.present_names})
    return FileIO(inputs, ["logits", *layout.present_names], axes)


@dataclass(frozen=True)
class Prompt:
    """A batch of prompts with their images' tokens, left-padded to one length."""

    input_ids: NDArray[np.int64]
    attention_mask: NDArray[np.int64]
    position_ids: NDArray[np.int64]
    counts: list[int]
    """Images per row, in the order their features are laid out."""


def with_images(text: list[int], images: int, per_image: int, token: int) -> list[int]:
    """A prompt's ids with ``images`` images' tokens: where it holds one image token per image,
    each becomes ``per_image`` of them (LLaVA's processor expands ``<image>`` so); a prompt that
    holds every image's tokens already is kept; one with none gets them after its first token
    (its BOS, where it has one)."""
    if text.count(token) == images * per_image:
        return list(text)
    if token in text:
        out: list[int] = []
        for t in text:
            out += [token] * per_image if t == token else [t]
        return out
    return [*text[:1], *([token] * (per_image * images)), *text[1:]]


def prompts(rows: list[list[int]], counts: list[int], per_image: int, token: int, pad: int) -> Prompt:
    """Each row's text ids with its images' tokens, left-padded (mask 0, position 1, as
    transformers' generate() pads) to the longest."""
    import numpy as np

    full = [with_images(r, n, per_image, token) if n else list(r) for r, n in zip(rows, counts, strict=True)]
    length = max(len(r) for r in full)
    ids = np.full((len(full), length), pad, dtype=np.int64)
    mask = np.zeros((len(full), length), dtype=np.int64)
    for i, r in enumerate(full):
        ids[i, length - len(r) :] = r
        mask[i, length - len(r) :] = 1
    positions = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1).astype(np.int64)
    return Prompt(ids, mask, positions, list(counts))


def text_ids(ids: NDArray[np.int64], vocab: int, token: int) -> NDArray[np.int64]:
    """Seeded token ids made text: every id below the vocabulary's size but the image placeholder."""
    out = ids % (vocab - 1)
    out[out >= token] += 1
    return out


def split_images(images: int, batch: int) -> list[int]:
    """Images per row: as evenly as they go, the first rows taking the remainder."""
    return [images // batch + (1 if r < images % batch else 0) for r in range(batch)]


def genai_config(config: PretrainedConfig, layout: PastLayout, per_image: int) -> str:
    """genai_config.json for onnxruntime-genai's multimodal runner (type phi3v: a vision, an
    embedding and a decoder file, the decoder taking inputs_embeds). Written from genai's
    documented keys; not run through onnxruntime-genai here (not installed)."""
    from onnxbuild._util import pretty_json

    text = config.get_text_config()
    eos = getattr(text, "eos_token_id", None)
    eos = eos if eos is not None else getattr(config, "eos_token_id", None)
    context = int(getattr(text, "max_position_embeddings", None) or 2048)
    token = getattr(config, "image_token_id", None)
    token = token if token is not None else getattr(config, "image_token_index", None)
    session = {"log_id": "onnxruntime-genai", "provider_options": []}
    doc = {
        "model": {
            "type": "phi3v",
            "bos_token_id": getattr(text, "bos_token_id", None),
            "eos_token_id": eos,
            "pad_token_id": getattr(text, "pad_token_id", None) or eos,
            "context_length": context,
            "vocab_size": int(text.vocab_size),
            "image_token_id": token,
            "vision": {
                "filename": VISION_FILE,
                "session_options": session,
                "inputs": {"pixel_values": PIXELS},
                "outputs": {"image_features": FEATURES},
                "num_image_tokens": per_image,
            },
            "embedding": {
                "filename": EMBEDDING_FILE,
                "session_options": session,
                "inputs": {"input_ids": "input_ids", "image_features": FEATURES},
                "outputs": {"inputs_embeds": EMBEDS},
            },
            "decoder": genai_decoder(
                VLM_DECODER_FILE,
                text,
                layout,
                {"inputs_embeds": EMBEDS, "attention_mask": "attention_mask", "position_ids": "position_ids"},
            ),
        },
        "search": {
            "do_sample": False,
            "early_stopping": True,
            "max_length": context,
            "min_length": 0,
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
