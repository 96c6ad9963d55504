"""Validating a vision-language variant: each of its three files on PyTorch's own inputs, against
transformers' own computation of the same part, and the three chained against the whole model.

Per shape (``num_images``, ``batch``, ``sequence``: the images go to the rows as evenly as they
go, each row's text tokens around its images' tokens, shorter rows left-padded):

- ``vision.image_features``: vision.onnx against transformers' ``get_image_features``;
- ``embedding.inputs_embeds``: embedding.onnx on the prompt and PyTorch's features, against the
  token embeddings with the image tokens' rows replaced (``masked_scatter``);
- ``decoder.logits`` and every ``decoder.present.*``: decoder.onnx on PyTorch's embeddings with
  an empty cache, against the language model and its head;
- ``decoder.next_step.logits``: one more token (PyTorch's greedy choice, embedded with no image
  features) through that cache;
- ``end_to_end.logits``: the three files chained on ONNX Runtime's own outputs, against the
  whole model's forward on the images and the prompt.

Logits are compared at the real (unpadded) positions; top-1 agreement counts the end-to-end and
next-step positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.errors import StepError
from onnxbuild.layouts.vlm_decoding import OrtVlm
from onnxbuild.recipe.sections import ExportSection, ValidateSection
from onnxbuild.steps.validating.cases import Checked

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from transformers import PreTrainedModel

    from onnxbuild.report.validation import OutputComparison

    Compare = Callable[[NDArray[np.generic], NDArray[np.generic], float, float], OutputComparison]


def validate_files(
    model: PreTrainedModel,
    source: Mapping[str, object],
    export: ExportSection,
    validate: ValidateSection,
    paths: list[Path],
    compare: Compare,
) -> Checked:
    """Each shape file by file and end to end, ONNX Runtime against PyTorch (the module's
    header says what is compared). ``model`` is a transformers vision-language model."""
    import numpy as np
    import torch

    from onnxbuild.sources import vlm
    from onnxbuild.sources.torchmodel import input_specs, make_inputs

    runner = OrtVlm.load(paths)
    layout = vlm.layout_of(model)
    token = vlm.image_token(model)
    text = vlm.text_config(model)
    vocab = int(text.vocab_size)
    pad = int(getattr(text, "pad_token_id", None) or 0)
    found = vlm.family(model)
    decoder = vlm.decoder_module(model, layout)
    specs = input_specs(source, export, natural=True)
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    results: list[dict[str, object]] = []
    hits = total = 0
    for i, sizes in enumerate(validate["shapes"]):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        pixels = feeds["pixel_values"]
        counts = vlm.split_images(pixels.shape[0], feeds["input_ids"].shape[0])
        outputs: dict[str, OutputComparison] = {}
        result: dict[str, object] = {
            "shape": dict(sizes),
            "passed": False,
            "error": None,
            "outputs": outputs,
            "top1_agreement": None,
        }
        with torch.no_grad():
            try:
                t_pixels = torch.from_numpy(pixels)
                t_features = found.reference(model, t_pixels)
                per_image = t_features.shape[0] // pixels.shape[0]
                prompt = vlm.prompts(
                    vlm.text_ids(feeds["input_ids"].astype(np.int64), vocab, token).tolist(),
                    counts,
                    per_image,
                    token,
                    pad,
                )
                t_ids = torch.from_numpy(prompt.input_ids)
                t_mask, t_positions = torch.from_numpy(prompt.attention_mask), torch.from_numpy(prompt.position_ids)
                plain = model.get_input_embeddings()(t_ids)
                t_embeds = plain.masked_scatter((t_ids == token)[..., None], t_features)
                batch = t_ids.shape[0]
                empty = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
                t_first = decoder(t_embeds, t_mask, t_positions, *empty)
                t_next_id = t_first[0][:, -1:].argmax(-1)
                t_next_embeds = model.get_input_embeddings()(t_next_id)
                t_grown = torch.cat([t_mask, torch.ones((batch, 1), dtype=t_mask.dtype)], 1)
                t_second = decoder(t_next_embeds, t_grown, t_positions[:, -1:] + 1, *t_first[1:])
                t_whole = model(
                    input_ids=t_ids,
                    attention_mask=t_mask,
                    position_ids=t_positions,
                    **found.pixels(t_pixels, counts),
                ).logits
            except Exception as exc:
                shown = ", ".join(f"{d}={v}" for d, v in sizes.items())
                raise StepError(
                    f"validate.shapes: PyTorch itself fails on the source model at {shown} ({type(exc).__name__}: "
                    f"{str(exc)[:300]})"
                ) from None
        real = prompt.attention_mask == 1
        try:
            features = runner.features(pixels)
            embeds = runner.embed(prompt.input_ids, t_features.numpy())
            first_logits, first_past = runner.step(
                t_embeds.numpy(), prompt.attention_mask, prompt.position_ids, runner.empty_past(batch)
            )
            next_embeds = runner.embed(t_next_id.numpy(), runner.no_features())
            second_logits, _ = runner.step(
                t_next_embeds.numpy(),
                t_grown.numpy(),
                prompt.position_ids[:, -1:] + 1,
                [p.numpy() for p in t_first[1:]],
            )
            chained, _ = runner.step(
                runner.embed(prompt.input_ids, features),
                prompt.attention_mask,
                prompt.position_ids,
                runner.empty_past(batch),
            )
        except Exception as exc:
            result["error"] = f"ONNX Runtime refused the inputs: {str(exc)[:500]}"
            results.append(result)
            continue
        pairs: list[tuple[str, NDArray[np.generic], NDArray[np.generic]]] = [
            ("vision.image_features", t_features.numpy(), features),
            ("embedding.inputs_embeds", t_embeds.numpy(), embeds),
            ("embedding.next_step.inputs_embeds", t_next_embeds.numpy(), next_embeds),
            ("decoder.logits", t_first[0].numpy()[real], np.asarray(first_logits)[real]),
            *(
                (f"decoder.{name}", t.numpy(), np.asarray(o))
                for name, t, o in zip(layout.present_names, t_first[1:], first_past, strict=True)
            ),
            ("decoder.next_step.logits", t_second[0].numpy(), np.asarray(second_logits)),
            ("end_to_end.logits", t_whole.float().numpy()[real], np.asarray(chained)[real]),
        ]
        ok = True
        for name, ref, got in pairs:
            cmp = compare(ref, got, rtol, atol)
            outputs[name] = cmp
            ok = ok and cmp["passed"]
        same = np.concatenate(
            [
                (t_whole.float().numpy()[real].argmax(-1) == np.asarray(chained)[real].argmax(-1)).ravel(),
                (t_second[0].numpy().argmax(-1) == np.asarray(second_logits).argmax(-1)).ravel(),
            ]
        )
        result["top1_agreement"] = float(same.mean())
        hits, total = hits + int(same.sum()), total + int(same.size)
        result["passed"] = ok
        results.append(result)
    return Checked(results, hits, total)
