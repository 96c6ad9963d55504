"""What export and validate share about a torch source: building the model, wrapping it, inputs.

Both steps rebuild the model from the source record instead of passing a pickled
model between processes; building it is deterministic (seeded), and it keeps each
step's memory to one model.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from onnxbuild.recipe.tasks import TASKS, TOKEN_INPUTS
from onnxbuild.steps.base import StepContext

INT_RANGE_DEFAULT = 10
"""Integer inputs of a plain torch model get values in [0, 10) unless the model says otherwise."""


def read_source_record(ctx: StepContext) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(ctx.input("reports/source.json").read_text(encoding="utf-8"))
    return record


def load_source_model(source: dict[str, Any], record: dict[str, Any], recipe_dir: Path) -> Any:
    (kind, src), = source.items()
    if kind == "huggingface":
        from onnxbuild.sources.huggingface import load_model

        return load_model(src, record, recipe_dir)
    from onnxbuild.sources.pytorch import load_model as load_torch

    return load_torch(src, record, recipe_dir)


def wrap(model: Any, source: dict[str, Any], input_names: list[str], output_names: list[str]) -> Any:
    """A module whose forward takes the inputs positionally and returns the outputs as a tuple.

    For transformers models it also passes an all-ones attention mask when the recipe
    leaves the mask out (TorchScript cannot trace GPT-2's mask creation without one:
    ``aten::diff`` is unsupported) and turns the KV cache off.
    """
    import torch

    (kind, _), = source.items()
    hf = kind == "huggingface"
    params = set(inspect.signature(model.forward).parameters) if hf else set()

    class Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            if not hf:
                out = self.model(*args)
                return tuple(out) if isinstance(out, (tuple, list)) else (out,)
            kwargs = dict(zip(input_names, args))
            if "attention_mask" in params and "attention_mask" not in kwargs:
                kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
            if "use_cache" in params:
                kwargs["use_cache"] = False
            out = self.model(**kwargs, return_dict=True)
            return tuple(out[name] for name in output_names)

    return Wrapped().eval()


def output_axes(source: dict[str, Any], export: dict[str, Any]) -> dict[str, dict[int, str]]:
    """Symbolic axes of the outputs, so they read batch/sequence instead of generated names."""
    (kind, src), = source.items()
    first = export["inputs"][0]["shape"] if export["inputs"] else []
    batch = first[0] if first and isinstance(first[0], str) else None
    seq = first[1] if len(first) > 1 and isinstance(first[1], str) else None
    axes: dict[str, dict[int, str]] = {}
    for name in export["outputs"]:
        ax: dict[int, str] = {}
        if batch:
            ax[0] = batch
        per_token = kind == "huggingface" and src["task"] != "text-classification"
        if per_token and seq:
            ax[1] = seq
        axes[name] = ax
    return axes


def vocab_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    return int(size) if size else None


def input_specs(source: dict[str, Any], export: dict[str, Any], *, natural: bool) -> list[dict[str, Any]]:
    """The inputs to feed. ``natural`` gives a transformers model its task's shapes
    (batch, sequence) even where the export fixed an axis, so validation sees the mistake."""
    (kind, _), = source.items()
    specs = [dict(t) for t in export["inputs"]]
    if natural and kind == "huggingface":
        for t in specs:
            if t["name"] in TOKEN_INPUTS:
                t["shape"] = ["batch", "sequence"]
    return specs


def make_inputs(specs: list[dict[str, Any]], sizes: dict[str, int], seed: int, vocab: int | None) -> dict[str, Any]:
    """Seeded numpy inputs: valid token ids below the vocabulary size, masks of ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for t in specs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in t["shape"])
        dtype = np.dtype(t["dtype"]) if t["dtype"] != "bfloat16" else np.dtype("float32")
        name = t["name"]
        if name == "attention_mask":
            out[name] = np.ones(shape, dtype=dtype)
        elif name == "token_type_ids":
            out[name] = np.zeros(shape, dtype=dtype)
        elif name == "position_ids":
            out[name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        elif dtype.kind in "iu":
            high = vocab if (vocab and name == "input_ids") else INT_RANGE_DEFAULT
            out[name] = rng.integers(0, high, size=shape, dtype=dtype)
        elif dtype.kind == "b":
            out[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def is_language_model(source: dict[str, Any]) -> bool:
    (kind, src), = source.items()
    return kind == "huggingface" and TASKS[src["task"]]["language_model"]
