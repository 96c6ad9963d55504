"""What export and validate share about a torch source: building the model, wrapping it, inputs.

Both steps rebuild the model from the source record instead of passing a pickled
model between processes; building it is deterministic (seeded), and it keeps each
step's memory to one model.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxbuild.errors import StepError
from onnxbuild.recipe.families import model_type
from onnxbuild.recipe.sections import ExportSection, Tensor
from onnxbuild.recipe.tasks import POOLED_TASKS, TOKEN_INPUTS, task_info
from onnxbuild.sources import source_kind
from onnxbuild.sources.decoder import PAST_PREFIX, PRESENT_PREFIX

if TYPE_CHECKING:
    import numpy as np
    import torch
    import transformers
    from numpy.typing import NDArray

    from onnxbuild.runtimes.sessions import TensorInfo
    from onnxbuild.sources.checkpoint import Lazy

POOLED_OUTPUTS = frozenset({"pooler_output", "text_embeds", "image_embeds", "sentence_embedding"})
"""One vector per input, whatever the task's other outputs hold per token."""

INT_RANGE_DEFAULT = 10
"""Integer inputs of a plain torch model get values in [0, 10) unless the model says otherwise."""


def load_source_model(source: Mapping[str, object], record: Mapping[str, object], recipe_dir: Path) -> Any:
    """The model a torch-traced source's record describes, from that source kind's module: a
    torch module, a transformers model or a Keras model, which the steps use as their source
    kind's (hence Any)."""
    from onnxbuild.sources import source_kind

    ((kind, src),) = source.items()
    load = source_kind(kind).load_model
    if load is None:
        raise ValueError(f"a {kind} source is not traced: it has no model to load")
    return load(src, record, recipe_dir)


def lazy_source_model(
    source: Mapping[str, object], record: Mapping[str, object], recipe_dir: Path
) -> tuple[Lazy, int] | None:
    """The source's model as a module tree whose weights are read from its safetensors files as
    they are touched (sources/checkpoint.Lazy), and its fp32 weight bytes; None where the weights
    are not in such files (in-memory random-init, GGUF, a torch module)."""
    from onnxbuild.sources import source_kind

    ((kind, src),) = source.items()
    described = source_kind(kind)
    folder = described.checkpoint_folder(src, record, recipe_dir) if described.checkpoint_folder else None
    if folder is None:
        return None
    import transformers

    from onnxbuild.sources import checkpoint
    from onnxbuild.sources.huggingface import task

    found = checkpoint.Checkpoint.of_folder(folder)
    if found is None:
        return None
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    auto = getattr(transformers, task(src)["auto_class"])  # type: ignore[arg-type]
    return checkpoint.lazy_model(auto, config, found), 4 * found.parameters()


def full_export(export: ExportSection, model: transformers.PreTrainedModel) -> ExportSection:
    """The export section with a decoder's past inputs and present outputs spelled out.

    ``export.with_past`` adds ``past_key_values.{i}.key/.value`` inputs and
    ``present.{i}.key/.value`` outputs whose count and sizes come from the model's config.
    """
    if not export.get("with_past"):
        return export
    from onnxbuild.sources.decoder import io_names, layout_of_model

    inputs, outputs = io_names(export, layout_of_model(model))
    return {**export, "inputs": inputs, "outputs": outputs}


def wrap(model: Any, source: Mapping[str, object], input_names: list[str], output_names: list[str]) -> Any:
    """A module whose forward takes the inputs positionally and returns the outputs as a tuple.
    ``model`` is what load_source_model gave: a torch module, or what the kind's adapter wraps
    (a Keras model); the result is a torch module, or that adapter (``kind.Adapted``), which the
    steps that trace a torch module never get: hence Any, both ways.

    For transformers models it also passes an all-ones attention mask when the recipe
    leaves the mask out (TorchScript cannot trace GPT-2's mask creation without one:
    ``aten::diff`` is unsupported) and turns the KV cache off, unless the inputs include
    the past (``export.with_past``), when the decoder wrapper takes over.
    """
    import torch

    ((kind, section),) = source.items()
    described = source_kind(kind)
    if described.adapter is not None:
        return described.adapter(model, input_names)
    hf = described.transformers
    if hf and any(n.startswith(PAST_PREFIX) for n in input_names):
        from onnxbuild.sources.decoder import wrap_with_past

        tokens = [n for n in input_names if not n.startswith(PAST_PREFIX)]
        outputs = [n for n in output_names if not n.startswith(PRESENT_PREFIX)]
        return wrap_with_past(model, tokens, outputs, sum(n.startswith(PAST_PREFIX) for n in input_names) // 2)
    params = set(inspect.signature(model.forward).parameters) if hf else set()
    pooled = hf and isinstance(section, Mapping) and section.get("task") in POOLED_TASKS

    class Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            if not hf:
                out = self.model(*args)
                return tuple(out) if isinstance(out, (tuple, list)) else (out,)
            tensors = dict(zip(input_names, args, strict=True))
            kwargs: dict[str, torch.Tensor | bool] = dict(tensors)
            if "attention_mask" in params and "attention_mask" not in kwargs and "input_ids" in kwargs:
                kwargs["attention_mask"] = torch.ones_like(tensors["input_ids"])
            if "use_cache" in params:
                kwargs["use_cache"] = False
            out = self.model(**kwargs, return_dict=True)
            if pooled:
                tokens = out["last_hidden_state"]
                mask = kwargs.get("attention_mask", torch.ones_like(tensors["input_ids"]))
                weights = torch.as_tensor(mask).unsqueeze(-1).to(tokens.dtype)
                pooled_out = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
                named = {"sentence_embedding": pooled_out, "token_embeddings": tokens}
                return tuple(named[name] if name in named else out[name] for name in output_names)
            return tuple(out[name] for name in output_names)

    return Wrapped().eval()


def output_axes(source: dict[str, Any], export: ExportSection) -> dict[str, dict[int, str]]:
    """Symbolic axes of the outputs, so they read batch/sequence instead of generated names."""
    ((kind, src),) = source.items()
    transformers = source_kind(kind).transformers
    first = export["inputs"][0]["shape"] if export["inputs"] else []
    batch = first[0] if first and isinstance(first[0], str) else None
    seq = first[1] if len(first) > 1 and isinstance(first[1], str) else None
    axes: dict[str, dict[int, str]] = {}
    for name in export["outputs"]:
        ax: dict[int, str] = {}
        if batch:
            ax[0] = batch
        if name.startswith(PRESENT_PREFIX):
            axes[name] = {**ax, 2: "total_sequence"}
            continue
        per_token = transformers and task_info(src["task"], model_type(src.get("config")))["per_token"]
        per_token = per_token and name not in POOLED_OUTPUTS
        if per_token and seq:
            ax[1] = seq
        axes[name] = ax
    return axes


def vocab_size(model: object) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    return int(size) if size else None


def input_specs(source: Mapping[str, object], export: ExportSection, *, natural: bool) -> list[Tensor]:
    """The inputs to feed. ``natural`` gives a transformers model its task's shapes
    (batch, sequence) even where the export fixed an axis, so validation sees the mistake."""
    ((kind, _),) = source.items()
    specs = [t.copy() for t in export["inputs"]]
    if natural and source_kind(kind).transformers:
        for t in specs:
            if t["name"] in TOKEN_INPUTS and len(t["shape"]) == 2:
                # a decoder's mask spans past + new tokens; the rest follow the new tokens
                t["shape"] = ["batch", "total_sequence" if "total_sequence" in t["shape"] else "sequence"]
    return specs


ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bool)": "bool",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
}
"""ONNX Runtime's input types as make_inputs names them."""


def session_specs(inputs: Iterable[TensorInfo], sizes: dict[str, int], fallback: str | None = None) -> list[Tensor]:
    """make_inputs' specs for an ONNX Runtime session's inputs (``get_inputs()``): a symbolic
    dimension make_inputs cannot size from ``sizes`` is 1. An input of another type gets
    ``fallback``, or raises ValueError naming it when there is none."""
    known = {*sizes, "past_sequence", "total_sequence"}
    specs: list[Tensor] = []
    for i in inputs:
        dtype = ORT_TYPES.get(i.type, fallback)
        if dtype is None:
            raise ValueError(f"input {i.name} has type {i.type}")
        specs.append(
            {"name": i.name, "dtype": dtype, "shape": [d if isinstance(d, int) or d in known else 1 for d in i.shape]}
        )
    return specs


def make_inputs(
    specs: Sequence[Tensor], sizes: dict[str, int], seed: int, vocab: int | None
) -> dict[str, NDArray[np.generic]]:
    """Seeded numpy inputs: valid token ids below the vocabulary size, masks of ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, NDArray[np.generic]] = {}
    # A decoder's mask covers the past and the new tokens; positions continue after the past.
    past = sizes.get("past_sequence", 0)
    sizes = {"past_sequence": past, **sizes, "total_sequence": past + sizes.get("sequence", 0)}
    for t in specs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in t["shape"])
        dtype = np.dtype(t["dtype"]) if t["dtype"] != "bfloat16" else np.dtype("float32")
        name = t["name"]
        if name == "attention_mask":
            out[name] = np.ones(shape, dtype=dtype)
        elif name == "token_type_ids":
            out[name] = np.zeros(shape, dtype=dtype)
        elif name == "pixel_values":
            # An image as a processor gives it: 8-bit pixels scaled to [0, 1], normalised
            # with mean and std 0.5 (ViT's), so values lie in [-1, 1] as real inputs do.
            pixels = rng.integers(0, 256, size=shape).astype(dtype) / 255.0
            out[name] = ((pixels - 0.5) / 0.5).astype(dtype)
        elif name == "input_features":
            # Log-mel features as Whisper's extractor scales them: (log10 + 4) / 4, about [-1, 1].
            out[name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        elif name == "position_ids":
            out[name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
        elif dtype.kind in "iu":
            high = vocab if (vocab and name == "input_ids") else INT_RANGE_DEFAULT
            out[name] = rng.integers(0, high, size=shape, dtype=dtype)
        elif dtype.kind == "b":
            out[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    if sizes.get("left_padding"):
        pad_left(out, sizes["left_padding"])
    return out


def pad_left(feeds: dict[str, NDArray[np.generic]], pad: int) -> None:
    """Left-pad the last row of a decoder's batch by ``pad`` tokens, in place, as a tokenizer
    pads a shorter prompt for generation: its first ``pad`` mask entries are 0 and its
    position_ids count from its first real token (``cumsum(mask) - 1``, as generate() does)."""
    import numpy as np

    mask = feeds["attention_mask"]
    mask[-1, :pad] = 0
    if "position_ids" in feeds:
        positions = feeds["position_ids"]
        counted = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        feeds["position_ids"] = counted[:, -positions.shape[-1] :].astype(positions.dtype)


def gates_top1(source: Mapping[str, object]) -> bool:
    """Whether the first output scores tokens or classes (top-1 agreement is measured)."""
    ((kind, src),) = source.items()
    return source_kind(kind).top1(src)


def labelled_inputs(
    got: object, specs: Sequence[Tensor], key: str
) -> tuple[dict[str, NDArray[np.generic]], NDArray[np.generic]]:
    """Check and convert what a dataset function returned: (inputs by export name, labels).

    Inputs are cast to the dtypes export.inputs declares (numpy gives float64 by default);
    every array and the labels must have the same number of samples along the first axis.
    """
    import numpy as np

    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], dict)):
        raise StepError(
            f"{key}: must return (inputs, labels): a dict of input name -> array and an array of class labels "
            f"(got {type(got).__name__})"
        )
    arrays, labels = got[0], np.asarray(got[1])
    names = [t["name"] for t in specs]
    missing = [n for n in names if n not in arrays]
    extra = [str(n) for n in arrays if n not in names]
    if missing or extra:
        what = "; ".join(
            part
            for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"not export inputs: {', '.join(extra)}" if extra else "",
            )
            if part
        )
        raise StepError(f"{key}: the inputs must be exactly export.inputs ({', '.join(names)}); {what}")
    if labels.dtype.kind not in "iu" or labels.ndim == 0:
        raise StepError(
            f"{key}: labels must be an array of integer class indices "
            f"(got {labels.dtype} of shape {list(labels.shape)})"
        )
    feeds: dict[str, NDArray[np.generic]] = {}
    for t in specs:
        value = np.asarray(arrays[t["name"]])
        if value.ndim == 0 or value.shape[0] != labels.shape[0]:
            raise StepError(
                f"{key}: input {t['name']} has shape {list(value.shape)} but there are {labels.shape[0]} labels; "
                "the first axis counts samples"
            )
        dtype = np.dtype(t["dtype"]) if t["dtype"] != "bfloat16" else np.dtype("float32")
        feeds[t["name"]] = np.ascontiguousarray(value.astype(dtype, copy=False))
    return feeds, labels


def load_tokenizer(
    source: dict[str, Any], record: Mapping[str, object], recipe_dir: Path, key: str = "validate.sentences"
) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of a transformers source: source.huggingface.tokenizer if given, else
    the model's own folder (local, package, or the Hub snapshot the source step recorded)."""
    import transformers

    from onnxbuild.sources.huggingface import gguf_where, is_gguf, local_folder

    ((kind, src),) = source.items()
    if not source_kind(kind).transformers:
        raise StepError(f"{key}: needs a huggingface source (this recipe's source is {kind})")
    extra: dict[str, object] = {}
    where: str | Path
    if src.get("tokenizer"):
        folder = recipe_dir / src["tokenizer"]
        where = folder if folder.is_dir() else src["tokenizer"]
    elif is_gguf(src):
        where, extra = gguf_where(src, recipe_dir)
    elif (folder := local_folder(src, recipe_dir)) is not None:
        where = folder
    else:
        where = src["model"]
        if record.get("hub_commit"):
            extra["revision"] = record["hub_commit"]
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **extra)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StepError(
            f"{key}: no tokenizer could be loaded from {where} ({first}); "
            "point source.huggingface.tokenizer at a folder with the tokenizer files"
        ) from None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # GPT-2 style: padding is masked out anyway
    return tokenizer


def sentence_inputs(
    tokenizer: transformers.PreTrainedTokenizerBase,
    sentences: list[str],
    specs: Sequence[Tensor],
    sizes: dict[str, int],
) -> tuple[dict[str, NDArray[np.generic]], NDArray[np.generic]]:
    """One padded batch of the sentences as the export's inputs, and its attention mask.

    Inputs the tokenizer does not produce (position_ids, say) are made as in
    :func:`make_inputs`; the mask is returned even when the export takes none, for pooling.
    """
    import numpy as np

    encoded = tokenizer(list(sentences), padding=True, truncation=True, return_tensors="np")
    ids = np.asarray(encoded["input_ids"])
    mask = np.asarray(encoded["attention_mask"]) if "attention_mask" in encoded else np.ones_like(ids)
    batch, sequence = ids.shape
    generated = make_inputs(
        [t for t in specs if t["name"] not in encoded],
        {**sizes, "batch": batch, "sequence": sequence},
        seed=0,
        vocab=None,
    )
    feeds: dict[str, NDArray[np.generic]] = {}
    for t in specs:
        if t["name"] in encoded:
            dtype = np.dtype(t["dtype"]) if t["dtype"] != "bfloat16" else np.dtype("float32")
            feeds[t["name"]] = np.asarray(encoded[t["name"]]).astype(dtype)
        else:
            feeds[t["name"]] = generated[t["name"]]
    return feeds, mask
