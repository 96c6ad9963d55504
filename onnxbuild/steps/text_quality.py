"""Quality on real text (``validate.text``), for text-generation models: what random inputs
cannot show.

Random token ids prove an export computes the same function; they say little about what a
quantized file loses, because a trained model's logits on random ids are near-flat and its
activation outliers (what breaks int8 on LLMs) show on real text. So the text is tokenized
with the model's own tokenizer, cut into windows of ``window`` tokens, and each window is run
as one prefill through PyTorch (the source model) and through the variant. Over every
next-token prediction of every window:

- perplexity, PyTorch's and the variant's, and the relative increase (the gate
  ``ppl_increase_max``);
- the mean KL divergence of the variant's next-token distribution from PyTorch's, in nats
  (``kld_max``): it sees a change in the whole distribution, where perplexity sees only the
  probability of the token that came;
- top-1 agreement with PyTorch (``text_top1_min``).

The gates default per precision (recipe/variants.py); a variant's own ``validate:`` overrides
them. Nothing here is a helper of the engine: validate calls it with the loaded model and
session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import TextSection
from onnxbuild.report.validation import TextQuality, text_failures

if TYPE_CHECKING:
    import numpy as np
    import torch
    from numpy.typing import ArrayLike, NDArray

GATES = ("ppl_increase_max", "kld_max", "text_top1_min")


class Tokenizer(Protocol):
    """A transformers tokenizer, as far as this calls it."""

    def __call__(self, text: str, *, add_special_tokens: bool) -> Mapping[str, Sequence[int]]: ...


def describe(text: TextSection) -> str:
    if text["file"]:
        return f"file {text['file']}"
    if text["package"]:
        return f"package file {text['package']}"
    return "inline text"


def read_text(text: TextSection, recipe_dir: Path) -> str:
    """The text validate.text names: a file beside the recipe, a file inside an installed
    package, or the text itself."""
    if text["inline"]:
        return text["inline"]
    if text["file"]:
        path, key = recipe_dir / text["file"], "validate.text.file"
    else:
        from onnxbuild.sources.huggingface import package_folder

        spec = str(text["package"])
        found = package_folder(spec)
        if found is None:
            raise StepError(
                f"validate.text.package: {spec}: the package {spec.split('/')[0]!r} is not installed; install it, "
                "or name a file beside the recipe under validate.text.file"
            )
        path, key = found, "validate.text.package"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StepError(f"{key}: {path} does not exist (file paths are relative to the recipe's folder)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StepError(f"{key}: cannot read {path} as UTF-8 text ({type(exc).__name__}: {str(exc)[:200]})") from None


def token_windows(tokenizer: Tokenizer, text: str, text_section: TextSection) -> NDArray[np.int64]:
    """The text's tokens as a [windows, window] int64 array: consecutive windows from the
    start, at most ``max_windows``; a text shorter than one window is an error that says how
    long it is."""
    import numpy as np

    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    window = int(text_section["window"])
    count = min(len(ids) // window, int(text_section["max_windows"]))
    if count == 0:
        raise StepError(
            f"validate.text: {describe(text_section)} is {len(ids)} tokens long, shorter than one window of {window}; "
            f"give more text or set validate.text.window to at most {max(2, len(ids))}"
        )
    return ids[: count * window].reshape(count, window)


@dataclass
class Tally:
    """Running sums over every prediction of every window."""

    nll_reference: float = 0.0
    nll: float = 0.0
    kl: float = 0.0
    same: int = 0
    count: int = 0

    def add(self, reference_logits: ArrayLike, logits: ArrayLike, targets: NDArray[np.generic]) -> None:
        """Logits [positions, vocab] of PyTorch and the variant, and the tokens that came next."""
        import numpy as np

        ref = _log_softmax(np.asarray(reference_logits, dtype=np.float64))
        got = _log_softmax(np.asarray(logits, dtype=np.float64))
        rows = np.arange(len(targets))
        self.nll_reference -= float(ref[rows, targets].sum())
        self.nll -= float(got[rows, targets].sum())
        self.kl += float((np.exp(ref) * (ref - got)).sum())
        self.same += int((ref.argmax(-1) == got.argmax(-1)).sum())
        self.count += len(targets)


def _log_softmax(x: NDArray[np.float64]) -> NDArray[np.float64]:
    import numpy as np

    shifted = x - x.max(axis=-1, keepdims=True)
    out: NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def measure(
    model: torch.nn.Module,
    run_onnx: Callable[[NDArray[np.int64]], ArrayLike],
    windows: NDArray[np.int64],
    text_section: TextSection,
    gates: Mapping[str, float | None],
    how: str = "",
) -> TextQuality:
    """Run every window through the PyTorch ``model`` (a transformers causal LM) and through
    ``run_onnx(ids) -> logits`` ([1, window] int64 -> [1, window, vocab]), and gate the figures;
    ``how`` says how the variant ran them when not as one prefill."""
    import math

    import numpy as np
    import torch

    tally = Tally()
    for row in windows:
        ids = row[None, :]
        with torch.no_grad():
            reference = model(input_ids=torch.from_numpy(ids), use_cache=False).logits[0].float().numpy()
        logits = np.asarray(run_onnx(ids))[0]
        # position t predicts token t + 1: the last position has nothing to predict here
        tally.add(reference[:-1], logits[:-1], row[1:])
    ppl_ref = math.exp(tally.nll_reference / tally.count)
    ppl = math.exp(tally.nll / tally.count)
    result: TextQuality = {
        "text": describe(text_section) + (f"; {how}" if how else ""),
        "windows": len(windows),
        "window": int(text_section["window"]),
        "predictions": tally.count,
        "perplexity_reference": ppl_ref,
        "perplexity": ppl,
        "ppl_increase": ppl / ppl_ref - 1.0,
        "kld_mean": max(0.0, tally.kl / tally.count),
        "top1_agreement": tally.same / tally.count,
        "ppl_increase_max": gates.get("ppl_increase_max"),
        "kld_max": gates.get("kld_max"),
        "text_top1_min": gates.get("text_top1_min"),
        "passed": True,
    }
    result["passed"] = not text_failures(result)
    return result
