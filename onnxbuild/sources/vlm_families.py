"""The vision-language families sources/vlm.py splits into three files: for each, the module
vision.onnx is traced from (the image count kept dynamic, where transformers'
``get_image_features`` unrolls it into a per-image list), transformers' own image features
that file is validated against, and the pixel arguments transformers' forward takes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.sources.kind import Problem

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

PIXELS = "pixel_values"


def _llava_features(model: PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    """LLaVA's get_image_features without its per-image list: the chosen hidden layer (CLS
    dropped under the "default" strategy), projected, every image's tokens in one list."""
    import torch

    config = model.config
    out = model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
    layer = config.vision_feature_layer
    layers = [layer] if isinstance(layer, int) else list(layer)
    chosen = [out.hidden_states[i] for i in layers]
    if config.vision_feature_select_strategy == "default":
        chosen = [h[:, 1:] for h in chosen]
    features: torch.Tensor = model.model.multi_modal_projector(torch.cat(chosen, dim=-1))
    # flatten, not reshape(-1, hidden): TorchScript's export then keeps the hidden size fixed
    return features.flatten(0, 1)


def _llava_vision(model: PreTrainedModel) -> torch.nn.Module:
    return _calling(model, _llava_features)


def _idefics3_vision(model: PreTrainedModel) -> torch.nn.Module:
    """Idefics3's (SmolVLM's) vision path for whole images of the tower's size: patches,
    position embeddings, the encoder (no patch mask: every patch is real), the pixel shuffle
    and the projection. transformers computes each image's position ids with ``bucketize``
    (no ONNX op); for a whole image of the tower's size they are the same for every image,
    so they are computed once here, by transformers' own code, and kept as a constant."""
    import torch

    parts = getattr(model, "model")  # noqa: B009  (Idefics3Model: not declared on PreTrainedModel)
    vision, connector = parts.vision_model, parts.connector
    config = model.config.vision_config
    size, channels = int(config.image_size), int(getattr(config, "num_channels", 3))
    seen: list[torch.Tensor] = []
    hook = vision.embeddings.position_embedding.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            side = size // int(config.patch_size)
            vision.embeddings(torch.zeros((1, channels, size, size)), torch.ones((1, side, side), dtype=torch.bool))
    finally:
        hook.remove()

    class Idefics3Vision(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.vision, self.connector = vision, connector
            self.register_buffer("positions", seen[0].clone())

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor]:
            embeddings = self.vision.embeddings
            patches = embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
            hidden = patches + embeddings.position_embedding(self.positions)
            hidden = self.vision.post_layernorm(self.vision.encoder(inputs_embeds=hidden).last_hidden_state)
            features: torch.Tensor = self.connector(hidden)
            return (features.flatten(0, 1),)

    return Idefics3Vision().eval()


def _idefics3_reference(model: PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    """transformers' own image features of the images as one row's ([1, N, C, H, W])."""
    import torch

    found = getattr(model, "get_image_features")(pixel_values=pixel_values[None])  # noqa: B009
    per_row: list[torch.Tensor] = list(found.pooler_output)
    return torch.cat(per_row, dim=0)


def _idefics3_pixels(pixel_values: torch.Tensor, counts: list[int]) -> dict[str, torch.Tensor]:
    """Idefics3 takes [batch, images, C, H, W]: a row with fewer images is padded with all-zero
    images, which transformers drops (a real all-zero image would be dropped too)."""
    import torch

    rows = torch.zeros((len(counts), max(counts), *pixel_values.shape[1:]), dtype=pixel_values.dtype)
    start = 0
    for i, n in enumerate(counts):
        rows[i, :n] = pixel_values[start : start + n]
        start += n
    return {PIXELS: rows}


def _calling(
    model: PreTrainedModel, features: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]
) -> torch.nn.Module:
    """A module whose forward is ``features(model, pixel_values)``."""
    import torch

    class Vision(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor]:
            return (features(self.model, pixel_values),)

    return Vision().eval()


def _llava_reference(model: PreTrainedModel, pixel_values: torch.Tensor) -> torch.Tensor:
    """transformers' own image features, concatenated as its forward concatenates them."""
    import torch

    # LLaVA's own method, which PreTrainedModel does not declare
    found = getattr(model, "get_image_features")(pixel_values=pixel_values)  # noqa: B009
    per_image: list[torch.Tensor] = list(found.pooler_output)
    return torch.cat(per_image, dim=0)


def _llava_pixels(pixel_values: torch.Tensor, counts: list[int]) -> dict[str, torch.Tensor]:
    """The pixel arguments transformers' LLaVA takes: every image in one batch."""
    return {PIXELS: pixel_values}


@dataclass(frozen=True)
class Family:
    """How one family of vision-language models is split into the three files."""

    model_types: tuple[str, ...]
    vision: Callable[[PreTrainedModel], torch.nn.Module]
    """The module vision.onnx is traced from: (pixel_values [num_images, C, H, W],) ->
    (image_features [num_image_tokens, hidden],), with a dynamic image count."""
    reference: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]
    """The same through transformers' own API: what the vision file is validated against."""
    pixels: Callable[[torch.Tensor, list[int]], dict[str, torch.Tensor]]
    """The keyword pixel arguments of transformers' forward and generate(), given the images
    and how many belong to each row."""


FAMILIES = (
    Family(("llava",), _llava_vision, _llava_reference, _llava_pixels),
    Family(("idefics3", "smolvlm"), _idefics3_vision, _idefics3_reference, _idefics3_pixels),
)
"""The families exported so far; a model type outside them is refused at the recipe."""

MODEL_TYPES = tuple(t for f in FAMILIES for t in f.model_types)


def family_of(model_type: object) -> Family | None:
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def family(model: PreTrainedModel) -> Family:
    found = family_of(getattr(model.config, "model_type", None))
    if found is None:
        raise StepError(
            f"source.huggingface.config.model_type: image-text-to-text exports {', '.join(MODEL_TYPES)} so far "
            f"(got {model.config.model_type!r})"
        )
    return found


def recipe_problems(config: Mapping[str, object], size: tuple[int, int] | None, dtype: str) -> Iterable[Problem]:
    """What the three files take, said at the recipe (the huggingface source kind's check): a
    family whose split is known, float32, and the vision tower's one image size (``size``, from
    the recipe's config.vision_config.image_size)."""
    if dtype != "float32":
        yield (
            ("source", "huggingface", "dtype"),
            "image-text-to-text models export in float32 (their decoder cache is float32); remove dtype",
            False,
        )
    model_type = config.get("model_type")
    if config and model_type not in MODEL_TYPES:
        yield (
            ("source", "huggingface", "config", "model_type"),
            f"image-text-to-text exports {', '.join(MODEL_TYPES)} so far (got {model_type!r})"
            + (
                "; an image encoder with a text decoder is task image-to-text"
                if model_type == "vision-encoder-decoder"
                else ""
            ),
            False,
        )
    elif size is None:
        yield (
            ("source", "huggingface", "config") if config else ("source", "huggingface"),
            "an image-text-to-text model takes images of its vision tower's one size: give "
            "config.vision_config.image_size (336 for llava-1.5)",
            not config,
        )
