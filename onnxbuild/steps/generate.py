"""The ``generate`` step: token-by-token generation through each variant's KV cache, beside
transformers' own ``generate`` on the source model.

Greedy tokens must be identical for fp32 variants. Random-init weights often repeat one
token, which makes a token comparison weak, so the step also compares the last-position
logits at every step (up to the first divergence, after which the two decode different
texts), runs a teacher-forced pass (the variant reads PyTorch's tokens and predicts each
next one: the agreement rate quantized variants are held to), and a seeded-sampling
comparison in which both engines draw with the same random numbers.

One module (~580 lines): the three comparisons share the prompt, the decode loop's state and
the verdict they feed (about a fifth of it is the report's TypedDicts); the decode loops
themselves are in runtimes/.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, SupportsInt, TypedDict, cast

from onnxbuild._util import brief, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import ExportSection, GenerateSection
from onnxbuild.recipe.variants import SOURCE_RECORD
from onnxbuild.report.generation import Comparison, GenerationReport, VariantGeneration, markdown
from onnxbuild.runtimes import sessions
from onnxbuild.sources import source_kind
from onnxbuild.spec import Checking, Found, Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec, VariantParam, read_source_record
from onnxbuild.steps.exporting import section as export_kind

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from onnxbuild.layouts.decoding import Chooser, Generation, OrtDecoder
    from onnxbuild.recipe.model import Recipe

PACKAGES = ("torch", "transformers", "tokenizers", "onnxruntime", "numpy")


MEMORY = (1.0, 1200)
"""Peak as (x the fp32 weights, MB more), measured on a Llama-3.2-1B shape (4.94 GB): 6.1 GB, the
largest session of its files (PyTorch's model streams its layers at that size)."""

QUANTIZED_MEMORY = (0.4, 1850)
"""Where the export itself is 4- or 8-bit (export.weights: no float file), of the fp32 weights:
the session holds the quantized weights and PyTorch streams its layers."""


def memory(recipe: Recipe) -> tuple[float, int]:
    return MEMORY if export_kind.model_precision(recipe) == "fp32" else QUANTIZED_MEMORY


class _GenerateNamed(TypedDict):
    generate: GenerateSection
    source: dict[str, dict[str, object]]
    variants: list[VariantParam]


class GenerateParams(_GenerateNamed, total=False):
    """What :func:`plan` puts in the step's params."""

    audio: bool
    image: bool
    export: ExportSection | None
    """A speech (image-to-text) model's whole export section (``export_kind.whole``), beside
    ``audio`` (``image``)."""


def plan(p: Planning) -> list[StepSpec]:
    """Every variant's greedy tokens against transformers' generate()."""
    r = p.recipe.resolved
    if not r.get("generate"):
        return []
    return [
        StepSpec(
            name="generate",
            kind="generate",
            params={
                "generate": r["generate"],
                "source": r["source"],
                "variants": [v.as_param() for v in p.variants],
                # speech (an image) in: the prompt is seeded features (pixels) of the export's shape
                **({"audio": True, **export_kind.whole(r)} if _task(r["source"]) == AUDIO else {}),
                **({"image": True, **export_kind.whole(r)} if _task(r["source"]) == IMAGE else {}),
            },
            deps=tuple(dict.fromkeys(["source", *(v.step for v in p.variants)])),
            inputs=(StepInput("source", SOURCE_RECORD), *(StepInput(v.step, f) for v in p.variants for f in v.paths)),
            outputs=("reports/generation.json", "reports/generation.md"),
        )
    ]


AUDIO, IMAGE = "automatic-speech-recognition", "image-to-text"
"""The encoder-decoder tasks whose encoder takes no text: generation starts from a seeded input."""


def _task(source: dict[str, dict[str, object]]) -> object:
    ((_, src),) = source.items()
    return src.get("task")


def prompt_ids(
    gen: GenerateSection, source: dict[str, dict[str, object]], record: dict[str, object], recipe_dir: Path, vocab: int
) -> tuple[NDArray[np.int64], PreTrainedTokenizerBase | None]:
    """The prompt as a [1, n] int64 array, and the tokenizer when one was needed or found."""
    import numpy as np

    from onnxbuild.sources.torchmodel import load_tokenizer

    tokenizer = None
    try:
        tokenizer = load_tokenizer(source, record, recipe_dir, key="generate.prompt")
    except StepError:
        if gen["prompt"] is not None:
            raise
    if gen["prompt"] is not None:
        assert tokenizer is not None  # load_tokenizer raised otherwise
        ids = np.asarray([_encode(tokenizer, gen["prompt"])], dtype=np.int64)
    elif gen["prompt_ids"] is not None:
        ids = np.asarray([gen["prompt_ids"]], dtype=np.int64)
    else:
        ids = np.random.default_rng(gen["seed"]).integers(0, vocab, size=(1, gen["prompt_length"]), dtype=np.int64)
    if ids.size == 0:
        raise StepError("generate.prompt: the tokenizer turned the prompt into no tokens; give a longer prompt")
    if int(ids.max()) >= vocab:
        raise StepError(f"generate.prompt_ids: token id {int(ids.max())} is outside the vocabulary (size {vocab})")
    return ids, tokenizer


def _end_tokens(model: PreTrainedModel) -> list[int]:
    """The ids transformers' min_new_tokens suppresses: the generation config's end tokens."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])]


def _without(ends: list[int]) -> Chooser:
    """Greedy choice with the end tokens ruled out."""
    from onnxbuild.layouts.decoding import greedy

    def choose(logits: NDArray[np.float32]) -> NDArray[np.int64]:
        if not ends:
            return greedy(logits)
        masked = logits.copy()
        masked[..., ends] = -float("inf")
        return greedy(masked)

    return choose


def _encode(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A prompt as the model is asked things: through its chat template where the tokenizer
    has one (an instruct model answers a bare prompt as text to continue), else as text."""
    if getattr(tokenizer, "chat_template", None):
        found = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        # a BatchEncoding (a UserDict) in recent transformers, the ids themselves before
        return [_token_id(i) for i in (found["input_ids"] if isinstance(found, Mapping) else found)]
    return [int(i) for i in tokenizer.encode(prompt)]


def _token_id(i: object) -> int:
    """int(i), for the items of apply_chat_template's result, which its signature leaves as
    text or nested lists too (one conversation's are ids)."""
    if isinstance(i, (str, SupportsInt)):
        return int(i)
    raise TypeError(f"int() argument must be a string, a bytes-like object or a real number, not '{type(i).__name__}'")


def compare_runs(ref: Generation, got: Generation) -> Comparison:
    """Token agreement and per-step logits differences of two generations of the same prompt."""
    import numpy as np

    same = ref.tokens == got.tokens
    diverged = [int(i) for i in np.flatnonzero(~same.all(axis=0))]
    first = diverged[0] if diverged else None
    # Logits at step i depend only on tokens before i, so they are comparable up to and
    # including the first divergence.
    upto = len(ref.logits) if first is None else first + 1
    diffs = [
        float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
        for a, b in zip(ref.logits[:upto], got.logits[:upto], strict=True)
    ]
    return {
        "identical": first is None,
        "agreement": float(same.mean()),
        "first_divergence": first,
        "logits_max_abs_diff": max(diffs) if diffs else 0.0,
        "logits_max_abs_diff_per_step": [round(d, 9) for d in diffs],
        "tokens": got.tokens[0].tolist(),
    }


def teacher_forced(decoder: OrtDecoder, prompt: NDArray[np.int64], ref_tokens: NDArray[np.int64]) -> float:
    """Fraction of PyTorch's tokens the variant predicts when it reads PyTorch's text so far."""
    import numpy as np

    sequence = np.concatenate([prompt, ref_tokens[:, :-1]], axis=1)
    if decoder.prefill is None:
        logits, _ = decoder.forward(sequence, decoder.empty_past(sequence.shape[0]), 0)
    else:  # served by two files: the prompt by one, each later token by the other, as it serves them
        logits = decoder.logits_as_served(sequence, prompt.shape[1])
    predicted = np.asarray(logits)[:, prompt.shape[1] - 1 :, :].argmax(-1)
    return float((predicted == ref_tokens).mean())


def _aligned(ref: Generation, got: Generation) -> Comparison:
    """compare_runs for generations that may stop at end-of-text at different steps: compared
    over the shorter, and a different length is a divergence where the shorter stopped."""
    from onnxbuild.layouts.decoding import Generation

    length = min(ref.tokens.shape[1], got.tokens.shape[1])
    cut = compare_runs(
        Generation(ref.tokens[:, :length], ref.logits[:length]), Generation(got.tokens[:, :length], got.logits[:length])
    )
    if cut["identical"] and ref.tokens.shape[1] != got.tokens.shape[1]:
        cut["identical"], cut["first_divergence"] = False, length  # cut is compare_runs' own new dict
    cut["tokens"] = got.tokens[0].tolist()
    return cut


def encoder_feeds(spec: StepSpec, model: PreTrainedModel) -> dict[str, NDArray[np.generic]]:
    """One seeded input (Whisper's audio features, an image-to-text model's pixels) at the
    export's sample size, batch 1."""
    from onnxbuild.sources.torchmodel import make_inputs

    export = export_kind.required(spec.params)
    sizes = {**export["sample"], "batch": 1}
    return make_inputs(export["inputs"], sizes, seed=int(spec.params["generate"]["seed"]), vocab=None)


def _seq2seq(
    ctx: StepContext,
    spec: StepSpec,
    gen: GenerateSection,
    variants: list[VariantParam],
    model: PreTrainedModel,
    prompt: NDArray[np.int64] | None,
    tokenizer: PreTrainedTokenizerBase | None,
    record: dict[str, object],
) -> StepResult:
    """An encoder-decoder: greedy decoding over encoder_model.onnx and decoder_model.onnx
    against transformers' generate() (stopping at end-of-text, as both do), per-step logits
    compared, and a teacher-forced pass over PyTorch's tokens for quantized variants."""
    import numpy as np

    from onnxbuild.layouts.decoding import Sampling
    from onnxbuild.layouts.seq2seq_decoding import OrtSeq2Seq, hf_generate, torch_generate
    from onnxbuild.sources.seq2seq import start_token

    n = int(gen["max_new_tokens"])
    feeds: dict[str, NDArray[np.generic]] = (
        {"input_ids": prompt, "attention_mask": np.ones_like(prompt)}
        if prompt is not None
        else encoder_feeds(spec, model)
    )
    reference = hf_generate(model, feeds, n)
    sampling = (
        Sampling(gen["seed"], float(gen["sampling"]["temperature"]), int(gen["sampling"]["top_k"]))
        if gen["sampling"] is not None
        else None
    )
    sampled_ref = torch_generate(model, feeds, n, sampling.chooser()) if sampling else None
    start, eos = start_token(model.config), getattr(model.config, "eos_token_id", None)
    del model
    results: dict[str, VariantGeneration] = {}
    problems: list[str] = []
    for variant in variants:
        encoder_path, decoder_path = (ctx.input(f) for f in variant["files"])
        runner = OrtSeq2Seq.load(encoder_path, decoder_path)
        got = runner.generate(feeds, start, n, eos)
        greedy_cmp = _aligned(reference, got)
        forced_ids = np.concatenate([np.full((1, 1), start, dtype=np.int64), reference.tokens[:, :-1]], axis=1)
        logits, _ = runner.step(forced_ids, runner.encode(feeds), feeds.get("attention_mask"), runner.empty_past(1))
        forced = float((np.asarray(logits).argmax(-1) == reference.tokens).mean())
        entry: VariantGeneration = {
            "precision": variant["precision"],
            "greedy": greedy_cmp,
            "teacher_forced_agreement": forced,
        }
        if sampling and sampled_ref is not None:
            entry["sampling"] = compare_runs(sampled_ref, runner.generate(feeds, start, n, None, sampling.chooser()))
        problem = _judge(entry, variant, gen, reference, tokenizer, skip_special=True)
        if problem:
            problems.append(problem)
        results[variant["name"]] = entry
    prompt_list = prompt[0].tolist() if prompt is not None else []
    return _finish(
        ctx,
        spec,
        record,
        gen,
        prompt_list,
        reference,
        sampled_ref,
        tokenizer,
        results,
        problems,
        f"{reference.tokens.shape[1]} new tokens (encoder-decoder)",
        skip_special=True,
    )


def _vlm(
    ctx: StepContext,
    spec: StepSpec,
    gen: GenerateSection,
    variants: list[VariantParam],
    model: PreTrainedModel,
    record: dict[str, object],
) -> StepResult:
    """A vision-language model: one seeded image and the prompt, greedy decoding over
    vision.onnx, embedding.onnx and decoder.onnx against transformers' generate() with the
    image (stopping at end-of-text, as both do), per-step logits compared, and a teacher-forced
    pass over PyTorch's tokens."""
    import numpy as np

    from onnxbuild.layouts.decoding import Sampling
    from onnxbuild.layouts.vlm_decoding import OrtVlm, hf_generate, torch_generate
    from onnxbuild.sources import vlm

    params = cast(GenerateParams, spec.params)
    token, text = vlm.image_token(model), vlm.text_config(model)
    vocab = int(text.vocab_size)
    ids, tokenizer = prompt_ids(gen, params["source"], record, ctx.recipe_dir, vocab)
    if gen["prompt"] is None and gen["prompt_ids"] is None:
        ids = vlm.text_ids(ids, vocab, token)  # seeded text: the image's tokens are placed, not drawn
    images = max(1, int((ids == token).sum()))  # each image token in the prompt stands for one image
    pixels = vlm.seeded_images(model, images, seed=int(gen["seed"]))
    prompt = vlm.prompts(ids.tolist(), [images], vlm.tokens_per_image(model), token, pad=0)
    n = int(gen["max_new_tokens"])
    reference = hf_generate(model, prompt, pixels, n)
    sampling = (
        Sampling(gen["seed"], float(gen["sampling"]["temperature"]), int(gen["sampling"]["top_k"]))
        if gen["sampling"] is not None
        else None
    )
    sampled_ref = torch_generate(model, prompt, pixels, n, sampling.chooser()) if sampling else None
    eos = getattr(text, "eos_token_id", None)
    del model
    results: dict[str, VariantGeneration] = {}
    problems: list[str] = []
    for variant in variants:
        runner = OrtVlm.load([ctx.input(f) for f in variant["files"]])
        got = runner.generate(prompt, pixels, n, eos)
        greedy_cmp = _aligned(reference, got)
        # PyTorch's text so far after the prompt: each of its next tokens predicted in one pass
        forced = np.concatenate([prompt.input_ids, reference.tokens[:, :-1]], axis=1)
        length = forced.shape[1]
        logits, _ = runner.step(
            runner.embed(forced, runner.features(pixels)),
            np.ones((1, length), dtype=np.int64),
            np.arange(length, dtype=np.int64)[None],
            runner.empty_past(1),
        )
        predicted = np.asarray(logits)[:, prompt.input_ids.shape[1] - 1 :, :].argmax(-1)
        entry: VariantGeneration = {
            "precision": variant["precision"],
            "greedy": greedy_cmp,
            "teacher_forced_agreement": float((predicted == reference.tokens).mean()),
        }
        if sampling and sampled_ref is not None:
            entry["sampling"] = compare_runs(sampled_ref, runner.generate(prompt, pixels, n, None, sampling.chooser()))
        problem = _judge(entry, variant, gen, reference, tokenizer, skip_special=False)
        if problem:
            problems.append(problem)
        results[variant["name"]] = entry
    return _finish(
        ctx,
        spec,
        record,
        gen,
        prompt.input_ids[0].tolist(),
        reference,
        sampled_ref,
        tokenizer,
        results,
        problems,
        f"{reference.tokens.shape[1]} new tokens after {images} image(s)",
        skip_special=False,
    )


def _judge(
    entry: VariantGeneration,
    variant: VariantParam,
    gen: GenerateSection,
    reference: Generation,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    skip_special: bool,
) -> str | None:
    """The variant's verdict into ``entry`` (its rule, pass, text), and the problem if it fails:
    fp32 must give PyTorch's greedy tokens, other precisions meet generate.agreement_min."""
    greedy_cmp, forced = entry["greedy"], entry["teacher_forced_agreement"]
    exact = variant["precision"] == "fp32"
    problem = None
    if exact:
        entry["passed"] = greedy_cmp["identical"]
        if not greedy_cmp["identical"]:
            i = greedy_cmp["first_divergence"]
            assert i is not None  # compare_runs: not identical where they diverge
            theirs = int(reference.tokens[0, i]) if i < reference.tokens.shape[1] else "end"
            ours = greedy_cmp["tokens"][i] if i < len(greedy_cmp["tokens"]) else "end"
            problem = (
                f"{variant['name']}: greedy tokens diverge from PyTorch's at new token {i} "
                f"(ONNX Runtime {ours}, PyTorch {theirs}; "
                f"logits max abs diff up to there {greedy_cmp['logits_max_abs_diff']:.2e})"
            )
    else:
        floor = gen["agreement_min"]
        entry["passed"] = floor is None or forced >= floor
        if not entry["passed"]:
            problem = (
                f"{variant['name']}: teacher-forced token agreement {forced:.3f} is below "
                f"generate.agreement_min {floor}"
            )
    entry["rule"] = (
        "greedy tokens identical to PyTorch"
        if exact
        else (
            f"teacher-forced agreement >= {gen['agreement_min']}"
            if gen["agreement_min"] is not None
            else "reported only (set generate.agreement_min to gate)"
        )
    )
    if tokenizer is not None:
        entry["text"] = tokenizer.decode(greedy_cmp["tokens"], skip_special_tokens=skip_special)
    return problem


def _finish(
    ctx: StepContext,
    spec: StepSpec,
    record: dict[str, object],
    gen: GenerateSection,
    prompt: list[int],
    reference: Generation,
    sampled_ref: Generation | None,
    tokenizer: PreTrainedTokenizerBase | None,
    results: dict[str, VariantGeneration],
    problems: list[str],
    what: str,
    *,
    skip_special: bool,
) -> StepResult:
    """reports/generation.json and .md, and the step's verdict."""
    report: GenerationReport = {
        "passed": not problems,
        "weights": record.get("weights"),
        "prompt_ids": prompt,
        "prompt": gen["prompt"],
        "max_new_tokens": int(gen["max_new_tokens"]),
        "pytorch": {
            "greedy_tokens": reference.tokens[0].tolist(),
            "text": tokenizer.decode(reference.tokens[0].tolist(), skip_special_tokens=skip_special)
            if tokenizer is not None
            else None,
            "sampling_tokens": sampled_ref.tokens[0].tolist() if sampled_ref else None,
        },
        "sampling": {"seed": gen["seed"], **gen["sampling"]}
        if sampled_ref is not None and gen["sampling"] is not None
        else None,
        "variants": results,
    }
    ctx.output("reports/generation.json").write_text(pretty_json(report), encoding="utf-8")
    ctx.output("reports/generation.md").write_text(markdown(report, ctx.recipe_name), encoding="utf-8")
    verdicts = ", ".join(
        f"{name} " + ("identical" if r["greedy"]["identical"] else f"agreement {r['teacher_forced_agreement']:.2f}")
        for name, r in results.items()
    )
    if problems:
        raise StepError(
            "generation does not match PyTorch: "
            + "; ".join(problems)
            + f". Report: artifacts/{ctx.recipe_name}/failed/{spec.name}/reports/generation.md"
        )
    return StepResult(
        summary=f"{what} vs PyTorch generate: {verdicts}",
        data={"passed": True, "identical": [k for k, r in results.items() if r["greedy"]["identical"]]},
    )


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnxruntime as ort

    from onnxbuild.layouts.decoding import OrtDecoder, Sampling, hf_generate, torch_generate
    from onnxbuild.sources.torchmodel import load_source_model, vocab_size

    params = cast(GenerateParams, spec.params)  # the JSON plan() built
    gen, source, variants = params["generate"], params["source"], params["variants"]
    record = read_source_record(ctx)
    model = load_source_model(source, record, ctx.recipe_dir)
    vocab = vocab_size(model) or 0
    if params.get("audio") or params.get("image"):  # the prompt is seeded features or pixels (no tokenizer yet)
        return _seq2seq(ctx, spec, gen, variants, model, None, None, record)
    ((kind, src),) = source.items()
    if source_kind(kind).vlm(src):
        return _vlm(ctx, spec, gen, variants, model, record)
    prompt, tokenizer = prompt_ids(gen, source, record, ctx.recipe_dir, vocab)
    n = int(gen["max_new_tokens"])
    if any(v.get("files") for v in variants):
        return _seq2seq(ctx, spec, gen, variants, model, prompt, tokenizer, record)
    reference = hf_generate(model, prompt, n)
    sampling = (
        Sampling(gen["seed"], float(gen["sampling"]["temperature"]), int(gen["sampling"]["top_k"]))
        if gen["sampling"] is not None
        else None
    )
    sampled_ref = torch_generate(model, prompt, n, sampling.chooser()) if sampling else None
    # transformers' generate() ran with end-of-text suppressed (min_new_tokens), so lengths
    # match; the variants are decoded by the same rule, or a trained model that answers in
    # seven tokens "diverges" where PyTorch was barred from stopping
    choose = _without(_end_tokens(model))
    del model

    results: dict[str, VariantGeneration] = {}
    problems: list[str] = []
    options = sessions.options()
    for variant in variants:
        loaded = {}
        for path in filter(None, (variant["path"], variant.get("prefill"))):
            try:
                loaded[path] = ort.InferenceSession(str(ctx.input(path)), options, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise StepError(f"ONNX Runtime cannot load {path}: {brief(exc)}") from None
        # the prompt on a served variant's prefill file, each later token on its decode file
        decoder = OrtDecoder(loaded[variant["path"]], prefill=loaded.get(variant.get("prefill") or ""))
        greedy_cmp = compare_runs(reference, decoder.generate(prompt, n, choose))
        forced = teacher_forced(decoder, prompt, reference.tokens)
        entry: VariantGeneration = {
            "precision": variant["precision"],
            "greedy": greedy_cmp,
            "teacher_forced_agreement": forced,
        }
        if sampling and sampled_ref is not None:
            entry["sampling"] = compare_runs(sampled_ref, decoder.generate(prompt, n, sampling.chooser()))
        problem = _judge(entry, variant, gen, reference, tokenizer, skip_special=False)
        if problem:
            problems.append(problem)
        results[variant["name"]] = entry
        del loaded, decoder

    return _finish(
        ctx,
        spec,
        record,
        gen,
        prompt[0].tolist(),
        reference,
        sampled_ref,
        tokenizer,
        results,
        problems,
        f"{n} new tokens",
        skip_special=False,
    )


def check(c: Checking) -> Iterable[Found]:
    gen = c.doc.get("generate")
    if gen is None:
        return
    if not c.with_past and not c.two_files and not c.three_files:
        yield (
            ("generate",),
            "generates through the KV cache; add export.with_past: true (a huggingface text-generation model)",
            True,
        )
    if c.two_files and c.task in (AUDIO, IMAGE) and isinstance(gen, dict):
        what = "a speech model's prompt is audio" if c.task == AUDIO else "an image-to-text model's prompt is an image"
        seeded = "features" if c.task == AUDIO else "pixels"
        for key in ("prompt", "prompt_ids"):
            if gen.get(key) is not None:
                yield (
                    ("generate", key),
                    f"{what}: generation starts from seeded {seeded} of the export's shape; remove it",
                    True,
                )
    if gen.get("prompt") is not None and gen.get("prompt_ids") is not None:
        yield ("generate", "prompt_ids"), "give either prompt (text) or prompt_ids (token ids), not both", True


KIND = StepKind(
    name="generate",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    memory_for=memory,
    imports=("onnxruntime",),
    loads_model=True,
    check=check,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
