"""``onnxbuild run``: a quick generation from a built decoder, for trying an artifact by hand.

It reads only the artifact folder (model.onnx with past inputs, config.json,
generation_config.json and tokenizer files when the build wrote them), so it works on
a folder copied to another machine, without the recipe or the cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxbuild.errors import UsageError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class RunResult:
    model: Path
    prompt_ids: list[int]
    new_ids: list[int]
    text: str | None
    """The decoded new tokens; None without a tokenizer."""
    chat_template: bool
    seconds: float
    stopped_at_eos: bool

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_ids) / self.seconds if self.seconds > 0 else 0.0


def model_path(artifact: str | Path, variant: str) -> Path:
    """``artifact`` is a model file, or an artifact folder whose ``variant`` is wanted."""
    path = Path(artifact)
    if path.is_file():
        return path
    if not path.is_dir():
        raise UsageError(f"{artifact}: no such file or folder; give an artifact folder (artifacts/<recipe name>) or a .onnx file")
    candidate = path / "model.onnx" if variant == "model" else path / variant / "model.onnx"
    if not candidate.is_file():
        found = sorted({"model"} if (path / "model.onnx").is_file() else set()) + sorted(p.parent.name for p in path.glob("*/model.onnx"))
        hint = f"variants here: {', '.join(found)}" if found else "build it first: onnxbuild make RECIPE"
        raise UsageError(f"{candidate} does not exist ({hint})")
    return candidate


def run(artifact: str | Path, prompt: str, *, max_new_tokens: int = 32, variant: str = "model", chat: bool = True, sampling: Any = None) -> RunResult:
    import numpy as np
    import onnxruntime as ort

    from onnxbuild.sources.decoder import OrtDecoder, greedy

    path = model_path(artifact, variant)
    folder = path.parent if (path.parent / "config.json").is_file() or variant == "model" else path.parent.parent
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise UsageError(f"{path}: ONNX Runtime cannot load it: {str(exc).splitlines()[0][:300]}") from None
    if not any(i.name.startswith("past_key_values.") for i in session.get_inputs()):
        raise UsageError(f"{path} takes no past_key_values inputs: build it with export.with_past: true in the recipe to generate from it")
    decoder = OrtDecoder(session)
    config = _json(folder / "config.json")
    generation = _json(folder / "generation_config.json")
    tokenizer = _tokenizer(folder)
    used_template = False
    if tokenizer is not None:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
            used_template = True
        else:
            ids = tokenizer.encode(prompt)
    else:
        try:
            ids = [int(t) for t in prompt.replace(",", " ").split()]
        except ValueError:
            raise UsageError(
                f"{folder} has no tokenizer files, so --prompt must be token ids (e.g. --prompt '464 2068 7586'); "
                "a recipe whose model folder has a tokenizer copies it beside model.onnx"
            ) from None
    if not ids:
        raise UsageError("--prompt: no tokens to start from; give some text or token ids")
    vocab = int(config.get("vocab_size") or 0)
    if vocab and max(ids) >= vocab:
        raise UsageError(f"--prompt: token id {max(ids)} is outside the vocabulary (size {vocab})")
    context = int(config.get("n_positions") or config.get("max_position_embeddings") or 0)
    if context and len(ids) + max_new_tokens > context:
        raise UsageError(f"--max-new-tokens: the prompt ({len(ids)} tokens) plus {max_new_tokens} new tokens exceeds the model's context of {context}; ask for at most {max(context - len(ids), 0)}")
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    eos = eos[0] if isinstance(eos, list) and eos else eos
    choose = sampling.chooser() if sampling is not None else greedy
    t0 = time.perf_counter()
    out = decoder.generate(np.asarray([ids], dtype=np.int64), max_new_tokens, choose, eos=eos if isinstance(eos, int) else None)
    seconds = time.perf_counter() - t0
    new = [int(t) for t in out.tokens[0]]
    text = tokenizer.decode(new, skip_special_tokens=True) if tokenizer is not None else None
    return RunResult(path, list(map(int, ids)), new, text, used_template, seconds, bool(isinstance(eos, int) and new and new[-1] == eos))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _tokenizer(folder: Path) -> Any:
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise UsageError(f"{folder}: the tokenizer files there cannot be loaded: {str(exc).splitlines()[0][:300]}") from None
