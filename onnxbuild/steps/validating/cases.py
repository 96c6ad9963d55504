"""The cases validation runs: the shapes (one off the sample in every axis), prefill and decode,
left-padded batches, their seeds, and real tokens where the model has a tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxbuild.recipe.sections import (
    ExportSection,
    ValidateSection,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray


def cases(shapes: list[dict[str, int]], with_past: bool, padded: bool = False) -> list[dict[str, int]]:
    """The shapes validation runs. A with-past decoder runs each shape that names no past
    twice: as a prefill (empty past) and as one decode step after that many tokens.

    ``padded`` (a decoder with an attention_mask and a free batch axis) adds a left-padded
    batch, prefill and decode, at the first shape of two rows or more (else the first shape
    with two rows): its last row's first half is padding, as generate() pads a shorter prompt.
    Outputs are compared at the real tokens only. Attention that reads a row as a prefix of
    the cache (GroupQueryAttention's seqlens_k) passes every unpadded case and fails this one."""
    if not with_past:
        return shapes
    out: list[dict[str, int]] = []
    for sizes in shapes:
        if "past_sequence" in sizes:
            out.append(dict(sizes))
            continue
        out.append({**sizes, "past_sequence": 0})
        out.append({**sizes, "sequence": 1, "past_sequence": sizes["sequence"]})
    fresh = [s for s in shapes if "past_sequence" not in s and s.get("sequence", 0) >= 2]
    if padded and fresh:
        base = next((s for s in fresh if s.get("batch", 1) >= 2), {**fresh[0], "batch": 2})
        pad = base["sequence"] // 2
        out.append({**base, "past_sequence": 0, "left_padding": pad})
        out.append({**base, "sequence": 1, "past_sequence": base["sequence"], "left_padding": pad})
    return out


@dataclass(frozen=True)
class Checked:
    """Validation results of a variant made of several files (an encoder-decoder's two, a
    vision-language model's three): one entry per shape, in the validate step's ShapeResult
    form, and the top-1 counts over every compared position."""

    results: list[dict[str, object]]  # validate.py casts each to ShapeResult
    top1_hits: int
    top1_total: int


@dataclass(frozen=True)
class RealTokens:
    """For a left-padded case: each output at the real tokens only (a padded query attends to
    nothing, and what a runtime writes there is not defined): outputs laid out [batch,
    sequence, ...] at the real new tokens, ``present.*`` caches [batch, heads, total, ...] at
    every real token. Other cases (``mask`` None) compare whole outputs."""

    mask: NDArray[np.bool_] | None = None
    past: int = 0

    @staticmethod
    def of(feeds: Mapping[str, NDArray[np.generic]], sizes: dict[str, int]) -> RealTokens:
        import numpy as np

        if not sizes.get("left_padding"):
            return RealTokens()
        return RealTokens(np.asarray(feeds["attention_mask"]).astype(bool), int(sizes.get("past_sequence", 0)))

    def _rule(self, name: str, shape: tuple[int, ...]) -> str:
        if self.mask is None:
            return ""
        if (
            name.startswith("present")
            and len(shape) >= 3
            and shape[0] == self.mask.shape[0]
            and shape[2] == self.mask.shape[1]
        ):
            return "cache"
        return "queries" if len(shape) >= 2 and shape[:2] == self.mask[:, self.past :].shape else ""

    def keep(self, name: str, array: ArrayLike) -> NDArray[np.generic]:
        import numpy as np

        whole = np.asarray(array)
        rule = self._rule(name, whole.shape)
        if self.mask is None or not rule:  # no mask: no rule
            return whole
        if rule == "cache":
            return np.moveaxis(whole, 2, 1)[self.mask]
        return whole[self.mask[:, self.past :]]

    def index(self, name: str, shape: tuple[int, ...], kept: list[int] | None) -> list[int] | None:
        """An index into ``keep``'s array, as an index into the whole output of ``shape``."""
        import numpy as np

        rule = self._rule(name, shape)
        if self.mask is None or not rule or not kept:
            return kept
        if rule == "cache":
            b, t = (int(i) for i in np.argwhere(self.mask)[kept[0]])
            return [b, kept[1], t, *kept[2:]]
        b, s = (int(i) for i in np.argwhere(self.mask[:, self.past :])[kept[0]])
        return [b, s, *kept[1:]]


def fixed_axis_hint(export: ExportSection, feeds: Mapping[str, NDArray[np.generic]]) -> str:
    for t in export["inputs"]:
        fixed = [i for i, d in enumerate(t["shape"]) if isinstance(d, int)]
        for i in fixed:
            if t["name"] in feeds and i < feeds[t["name"]].ndim and feeds[t["name"]].shape[i] != t["shape"][i]:
                return (
                    f" (export.inputs declares {t['name']} axis {i} fixed at {t['shape'][i]}; "
                    "name it, e.g. sequence, to make it dynamic)"
                )
    return ""


LEFT_OUT = "no left-padded batch validated (validate.left_padding: false)"


def case_seed(validate: ValidateSection, export: ExportSection, sizes: dict[str, int]) -> int | None:
    """The seed validation made ``sizes``' inputs with (validate.seed + the case's index),
    or None when validation runs no such case."""
    if export.get("with_past") and "past_sequence" not in sizes:
        sizes = {**sizes, "past_sequence": 0}
    return next(
        (int(validate["seed"]) + i for i, c in enumerate(validation_cases(validate, export)) if c == sizes), None
    )


def validation_cases(validate: ValidateSection, export: ExportSection) -> list[dict[str, int]]:
    """The cases a recipe's validation runs, in order (case i's inputs are seeded validate.seed + i)."""
    padded = free_batch(export) and validate.get("left_padding", True)
    return cases(validate["shapes"], bool(export.get("with_past")), padded=padded)


def free_batch(export: ExportSection) -> bool:
    """Whether the export takes an attention_mask with a free batch axis (a left-padded case
    needs both: the mask to pad, two rows)."""
    return any(
        t["name"] == "attention_mask" and t["shape"] and isinstance(t["shape"][0], str) for t in export["inputs"]
    )


def again(validate: ValidateSection, shape: dict[str, int]) -> str:
    """explain-mismatch's options for a left-padded case (the recipe shape its prefill came from)."""
    if not shape.get("left_padding"):
        return ""
    length = shape["sequence"] if not shape.get("past_sequence") else shape["past_sequence"]
    index = next(
        (i for i, s in enumerate(validate["shapes"]) if s.get("sequence") == length and "past_sequence" not in s), 0
    )
    return f" --shape {index} --left-padding {shape['left_padding']}"
