"""Encoder-decoder models (T5, BART, Marian): two ONNX files, the wrappers that trace them,
and the loops that run them.

The layout is Optimum's and onnxruntime-genai's: ``encoder_model.onnx`` turns the text's
tokens into hidden states once; ``decoder_model.onnx`` takes new decoder tokens, the
encoder's hidden states and mask, and the decoder's self-attention cache, and returns the
logits and the grown cache. A first step is a call with an empty cache (past_sequence 0),
so one decoder file serves the first and every later step. Cross-attention keys and values
are computed from the hidden states in each call: one file instead of two, at the cost of
two small matmuls per layer and step.

Axes: the encoder's ``input_ids`` / ``attention_mask`` are [batch, sequence]; the decoder's
``input_ids`` [batch, decoder_sequence]; its past [batch, heads, past_sequence, head_dim].
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from onnxbuild.errors import StepError
from onnxbuild.recipe.tasks import DECODER_FILE, DEFAULT_DECODER_SEQUENCE, ENCODER_FILE
from onnxbuild.runtimes import sessions
from onnxbuild.sources.decoder import Generation, PastLayout

ENCODER, DECODER = ENCODER_FILE, DECODER_FILE
ENCODER_OUTPUT = "last_hidden_state"
DECODER_INPUTS = ("input_ids", "encoder_hidden_states", "encoder_attention_mask")


def layout_of(config: Any) -> PastLayout:
    """The decoder's self-attention cache: T5 names its sizes num_decoder_layers / num_heads /
    d_kv, BART and Marian decoder_layers / decoder_attention_heads / d_model."""
    layers = int(
        getattr(config, "num_decoder_layers", None)
        or getattr(config, "decoder_layers", None)
        or config.num_hidden_layers
    )
    heads = int(getattr(config, "decoder_attention_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "d_kv", None) or config.d_model // heads)
    return PastLayout(layers=layers, kv_heads=heads, head_dim=head_dim)


def _cache_arg(model: Any) -> str:
    # transformers 5.x renamed past_key_values to cache on some models
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def encoder_module(model: Any, names: list[str]) -> Any:
    """(the export's inputs: input_ids and attention_mask, or Whisper's input_features) -> (hidden states,)."""
    import torch

    class Encoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, *args: Any) -> Any:
            return (self.encoder(**dict(zip(names, args, strict=True)), return_dict=True).last_hidden_state,)

    return Encoder().eval()


def decoder_module(model: Any, layout: PastLayout, masked: bool) -> Any:
    """(input_ids, encoder_hidden_states, [encoder_attention_mask,] past...) -> (logits, presents...).
    Whisper's encoder states have no padding, so its decoder takes no mask (``masked`` false)."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    cache_arg = _cache_arg(model)

    class Decoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, encoder_hidden_states: Any, *rest: Any) -> Any:
            config = self.model.config
            mask, past = (rest[0], rest[1:]) if masked else (None, rest)
            own = DynamicCache(
                ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layout.layers)], config=config
            )
            cache = EncoderDecoderCache(own, DynamicCache(config=config))
            out = self.model(
                decoder_input_ids=input_ids,
                encoder_outputs=(encoder_hidden_states,),
                use_cache=True,
                **({"attention_mask": mask} if masked else {}),
                return_dict=True,
                **{cache_arg: cache},
            )
            grown = out.get("past_key_values") if out.get("past_key_values") is not None else out.get("cache")
            flat: list[Any] = []
            for layer in grown.self_attention_cache.layers:
                flat += [layer.keys, layer.values]
            return (out["logits"], *flat)

    return Decoder().eval()


def decoder_io(
    layout: PastLayout, hidden: int, encoder_length: int | str, masked: bool
) -> tuple[list[dict[str, Any]], list[str], dict[str, dict[int, str]]]:
    """The decoder file's input specs, output names and dynamic axes."""
    inputs: list[dict[str, Any]] = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "decoder_sequence"]},
        {"name": "encoder_hidden_states", "dtype": "float32", "shape": ["batch", encoder_length, hidden]},
        *([{"name": "encoder_attention_mask", "dtype": "int64", "shape": ["batch", "sequence"]}] if masked else []),
        *layout.past_specs(),
    ]
    outputs = ["logits", *layout.present_names]
    axes = {t["name"]: {i: d for i, d in enumerate(t["shape"]) if isinstance(d, str)} for t in inputs}
    axes["logits"] = {0: "batch", 1: "decoder_sequence"}
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in layout.present_names})
    return inputs, outputs, axes


def start_token(config: Any) -> int:
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    return int(start or 0)


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class OrtSeq2Seq:
    """An encoder and a decoder session, run as transformers runs the model."""

    encoder: Any
    decoder: Any
    layout: PastLayout

    @classmethod
    def load(cls, encoder_path: Any, decoder_path: Any, threads: int = 0) -> OrtSeq2Seq:
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

    def encode(self, feeds: dict[str, Any]) -> Any:
        return self.encoder.run([ENCODER_OUTPUT], feeds)[0]

    @property
    def masked(self) -> bool:
        return any(i.name == "encoder_attention_mask" for i in self.decoder.get_inputs())

    def empty_past(self, batch: int) -> list[Any]:
        import numpy as np

        return [
            np.zeros((batch, self.layout.kv_heads, 0, self.layout.head_dim), dtype=np.float32)
            for _ in self.layout.past_names
        ]

    def step(self, ids: Any, hidden: Any, mask: Any, past: list[Any]) -> tuple[Any, list[Any]]:
        feeds = {
            "input_ids": ids,
            "encoder_hidden_states": hidden,
            **({"encoder_attention_mask": mask} if self.masked else {}),
            **dict(zip(self.layout.past_names, past, strict=True)),
        }
        out = self.decoder.run(None, feeds)
        return out[0], list(out[1:])

    def generate(
        self, feeds: dict[str, Any], start: int, max_new_tokens: int, eos: int | None, choose: Any = None
    ) -> Generation:
        """Greedy (or ``choose``'s) decoding from the start token, stopping once every row
        has produced ``eos``."""
        import numpy as np

        from onnxbuild.sources.decoder import greedy

        choose = choose or greedy

        hidden = self.encode(feeds)
        mask = feeds.get("attention_mask")
        batch = hidden.shape[0]
        past = self.empty_past(batch)
        cur = np.full((batch, 1), start, dtype=np.int64)
        tokens, steps = [], []
        finished = np.zeros(batch, dtype=bool)
        for _ in range(max_new_tokens):
            logits, past = self.step(cur, hidden, mask, past)
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


def torch_generate(model: Any, feeds: dict[str, Any], max_new_tokens: int, choose: Any) -> Generation:
    """The same loop on the PyTorch model through the export's own wrappers, for the seeded
    sampling comparison (no end-of-text stop, so both make as many tokens)."""
    import numpy as np
    import torch

    layout = layout_of(model.config)
    names = list(feeds)
    masked = "attention_mask" in names
    encoder, decoder = encoder_module(model, names), decoder_module(model, layout, masked)
    mask = (torch.from_numpy(feeds["attention_mask"]),) if masked else ()
    tokens, steps = [], []
    with torch.inference_mode():
        (hidden,) = encoder(*(torch.from_numpy(feeds[n]) for n in names))
        batch = hidden.shape[0]
        past: list[Any] = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
        cur = torch.full((batch, 1), start_token(model.config), dtype=torch.long)
        for _ in range(max_new_tokens):
            logits, *past = decoder(cur, hidden, *mask, *past)
            last = logits[:, -1, :].float().numpy()
            steps.append(last)
            nxt = choose(last)
            tokens.append(nxt)
            cur = torch.from_numpy(nxt[:, None])
    return Generation(np.stack(tokens, axis=1), steps)


def hf_generate(model: Any, feeds: dict[str, Any], max_new_tokens: int, stop_at_eos: bool = True) -> Generation:
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


# ---------------------------------------------------------------- validation


@dataclass(frozen=True)
class Checked:
    """Validation results of an encoder-decoder variant: one entry per shape, in the
    validate step's ShapeResult form, and the top-1 counts over every decoder position."""

    results: list[dict[str, Any]]
    top1_hits: int
    top1_total: int


def validate_files(
    model: Any, source: dict[str, Any], export: Any, validate: Any, paths: list[Any], compare: Any
) -> Checked:
    """Each shape end to end, ONNX Runtime against PyTorch: the encoder's hidden states; the
    decoder's first call (``decoder_sequence`` tokens, empty cache) on each engine's own
    hidden states, logits and grown cache; then one more token through that cache."""
    import numpy as np
    import torch

    from onnxbuild.sources.torchmodel import input_specs, make_inputs

    ort_model = OrtSeq2Seq.load(paths[0], paths[1])
    layout = layout_of(model.config)
    names = [t["name"] for t in export["inputs"]]
    masked = "attention_mask" in names
    encoder, decoder = encoder_module(model, names), decoder_module(model, layout, masked)
    vocab = int(model.config.vocab_size)
    specs = input_specs(source, export, natural=True)
    rtol, atol = float(validate["rtol"]), float(validate["atol"])
    results: list[dict[str, Any]] = []
    hits = total = 0
    for i, sizes in enumerate(validate["shapes"]):
        feeds = make_inputs(specs, sizes, seed=int(validate["seed"]) + i, vocab=vocab)
        batch = next(iter(feeds.values())).shape[0]
        mask = feeds.get("attention_mask")
        steps = int(sizes.get("decoder_sequence", DEFAULT_DECODER_SEQUENCE))
        decoder_ids = np.random.default_rng(int(validate["seed"]) + 1000 + i).integers(
            0, vocab, size=(batch, steps), dtype=np.int64
        )
        result: dict[str, Any] = {
            "shape": dict(sizes),
            "passed": False,
            "error": None,
            "outputs": {},
            "top1_agreement": None,
        }
        with torch.no_grad():
            t_mask = (torch.from_numpy(mask),) if mask is not None else ()
            try:
                (t_hidden,) = encoder(*(torch.from_numpy(feeds[n]) for n in names))
                empty = [torch.zeros((batch, layout.kv_heads, 0, layout.head_dim)) for _ in layout.past_names]
                t_first = decoder(torch.from_numpy(decoder_ids), t_hidden, *t_mask, *empty)
                t_next_id = t_first[0][:, -1:].argmax(-1)
                t_second = decoder(t_next_id, t_hidden, *t_mask, *t_first[1:])
            except Exception as exc:
                shown = ", ".join(f"{d}={v}" for d, v in sizes.items())
                raise StepError(
                    f"validate.shapes: PyTorch itself fails on the source model at {shown} ({type(exc).__name__}: "
                    f"{str(exc)[:300]})"
                ) from None
        try:
            hidden = ort_model.encode(feeds)
            first_logits, first_past = ort_model.step(decoder_ids, hidden, mask, ort_model.empty_past(batch))
            second_logits, _ = ort_model.step(t_next_id.numpy(), hidden, mask, first_past)
        except Exception as exc:
            result["error"] = f"ONNX Runtime refused the inputs: {str(exc)[:500]}"
            results.append(result)
            continue
        pairs = [
            ("encoder.last_hidden_state", t_hidden, hidden),
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
            result["outputs"][name] = cmp
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
