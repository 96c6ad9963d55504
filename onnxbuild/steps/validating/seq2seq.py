"""Validating an encoder-decoder variant end to end: the encoder (hidden states and cross keys
and values), the decoder's first call on each engine's own cross keys and values, and one more
token through its cache, ONNX Runtime against PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from onnxbuild.errors import StepError
from onnxbuild.layouts.seq2seq_decoding import OrtSeq2Seq
from onnxbuild.recipe.sections import ExportSection, ValidateSection
from onnxbuild.recipe.tasks import DEFAULT_DECODER_SEQUENCE
from onnxbuild.sources.seq2seq import ENCODER_OUTPUT, cross_outputs, decoder_module, encoder_module, layout_of
from onnxbuild.steps.validating.cases import Checked

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from onnxbuild.report.validation import OutputComparison

    Compare = Callable[[NDArray[np.generic], NDArray[np.generic], float, float], OutputComparison]


class _Config(Protocol):
    @property
    def vocab_size(self) -> int: ...


class Seq2SeqModel(Protocol):
    """What this reads of the transformers encoder-decoder itself; sources/seq2seq.py takes the rest."""

    @property
    def config(self) -> _Config: ...


def validate_files(
    model: Seq2SeqModel,
    source: Mapping[str, object],
    export: ExportSection,
    validate: ValidateSection,
    paths: list[Path],
    compare: Compare,
) -> Checked:
    """Each shape end to end, ONNX Runtime against PyTorch: the encoder's hidden states and
    cross keys and values; the decoder's first call (``decoder_sequence`` tokens, empty
    cache) on each engine's own cross keys and values, logits and grown cache; then one more
    token through that cache."""
    import numpy as np
    import torch

    from onnxbuild.sources.torchmodel import input_specs, make_inputs

    ort_model = OrtSeq2Seq.load(paths[0], paths[1])
    layout = layout_of(model.config)
    names = [t["name"] for t in export["inputs"]]
    masked = "attention_mask" in names
    encoder, decoder = encoder_module(model, names, layout), decoder_module(model, layout, masked)
    encoder_outputs = [ENCODER_OUTPUT, *cross_outputs(layout)]
    vocab = int(model.config.vocab_size)
    specs = input_specs(source, export, natural=True)
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    results: list[dict[str, object]] = []
    hits = total = 0
    for i, sizes in enumerate(validate["shapes"]):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        batch = next(iter(feeds.values())).shape[0]
        mask = feeds.get("attention_mask")
        steps = int(sizes.get("decoder_sequence", DEFAULT_DECODER_SEQUENCE))
        decoder_ids = np.random.default_rng(int(validate["seed"]) + 1000 + i).integers(
            0, vocab, size=(batch, steps), dtype=np.int64
        )
        outputs: dict[str, OutputComparison] = {}
        result: dict[str, object] = {
            "shape": dict(sizes),
            "passed": False,
            "error": None,
            "outputs": outputs,
            "top1_agreement": None,
        }
        with torch.no_grad():
            t_mask = (torch.from_numpy(mask),) if mask is not None else ()
            try:
                t_encoded = encoder(*(torch.from_numpy(feeds[n]) for n in names))
                t_cross = t_encoded[1:]
                empty = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
                t_first = decoder(torch.from_numpy(decoder_ids), *t_mask, *empty, *t_cross)
                t_next_id = t_first[0][:, -1:].argmax(-1)
                t_second = decoder(t_next_id, *t_mask, *t_first[1:], *t_cross)
            except Exception as exc:
                shown = ", ".join(f"{d}={v}" for d, v in sizes.items())
                raise StepError(
                    f"validate.shapes: PyTorch itself fails on the source model at {shown} ({type(exc).__name__}: "
                    f"{str(exc)[:300]})"
                ) from None
        try:
            encoded = ort_model.encoder.run(encoder_outputs, feeds)
            cross = encoded[1:]
            first_logits, first_past = ort_model.step(decoder_ids, cross, mask, ort_model.empty_past(batch))
            second_logits, _ = ort_model.step(t_next_id.numpy(), cross, mask, first_past)
        except Exception as exc:
            result["error"] = f"ONNX Runtime refused the inputs: {str(exc)[:500]}"
            results.append(result)
            continue
        pairs = [
            *((f"encoder.{name}", t, o) for name, t, o in zip(encoder_outputs, t_encoded, encoded, strict=True)),
            ("decoder.logits", t_first[0], first_logits),
            *(
                (f"decoder.{name}", t, o)
                for name, t, o in zip(layout.present_names, t_first[1:], first_past, strict=True)
            ),
            ("decoder.next_step.logits", t_second[0], second_logits),
        ]
        ok = True
        for name, ref, got in pairs:
            cmp = compare(ref.float().numpy(), np.asarray(got), rtol, atol)
            outputs[name] = cmp
            ok = ok and cmp["passed"]
        same = np.concatenate(
            [
                (t_first[0].numpy().argmax(-1) == first_logits.argmax(-1)).ravel(),
                (t_second[0].numpy().argmax(-1) == second_logits.argmax(-1)).ravel(),
            ]
        )
        result["top1_agreement"] = float(same.mean())
        hits, total = hits + int(same.sum()), total + int(same.size)
        result["passed"] = ok
        results.append(result)
    return Checked(results, hits, total)
